from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from campaigns import views as campaign_views

urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/", include("accounts.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include("api.urls")),
    path("metrics", campaign_views.metrics, name="metrics"),
    path("inventory/", include("inventory.urls")),
    path("", include("analysis.urls")),
    path("", include("scheduling.urls")),
    path("", include("campaigns.urls")),
]

# Under /api/ even a URL no route matches (an id that is not a number, a typo) answers in the one error shape.
handler404 = "api.errors.page_not_found"
