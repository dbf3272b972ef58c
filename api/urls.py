from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from api import views

# No ".json" suffix routes: they add nothing to content negotiation (Accept, ?format=) and handed the actions a
# "format" argument they do not take (a 500).
router = DefaultRouter()
router.include_format_suffixes = False
router.register("nodes", views.NodeViewSet, basename="node")
router.register("interfaces", views.InterfaceViewSet, basename="interface")
router.register("credentials", views.CredentialViewSet, basename="credential")
router.register("storage-systems", views.StorageSystemViewSet, basename="storage-system")
router.register("presets", views.PresetViewSet, basename="preset")
router.register("campaigns", views.CampaignViewSet, basename="campaign")
router.register("suites", views.SuiteViewSet, basename="suite")
router.register("suite-runs", views.SuiteRunViewSet, basename="suite-run")
router.register("runs", views.RunViewSet, basename="run")
router.register("results", views.ResultViewSet, basename="result")
router.register("baselines", views.BaselineViewSet, basename="baseline")
router.register("verdicts", views.VerdictViewSet, basename="verdict")

app_name = "api"
urlpatterns = [
    path("compare/", views.CompareView.as_view(), name="compare"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="api:schema"), name="redoc"),
    path("", include(router.urls)),
]
