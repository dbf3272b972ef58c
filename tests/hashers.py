"""The password hasher of the test session: Django's PBKDF2 hasher, the production one, with few iterations.

At the production count (a million) one hash costs most of a second on a loaded 2-core CI machine, and the suite makes
hundreds: every persona fixture, every ``client.login`` and every login form post. What the tests prove about logins
(lockouts, rates, sessions, who may see what) does not depend on the count; hashes made with any count still check.
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class FewIterationsPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1000
