import gc
import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackbench.settings")
application = get_wsgi_application()

# What the application has loaded (every view too: the URL patterns import them) lives as long as the process. Frozen
# out of the collector's reach, it is never traversed again: a full collection during a request visits only what the
# requests made. Otherwise each visits some 180,000 objects (40-100 ms of CPU on a 2-core machine), and a page that
# builds a large table (compare of two 5,000-run campaigns) sets one off every few requests (bench/compare_page.py).
get_resolver().url_patterns  # noqa: B018
gc.collect()
gc.freeze()
