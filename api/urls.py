from django.urls import include, path
from rest_framework.routers import DefaultRouter

from api import views

router = DefaultRouter()
router.register("nodes", views.NodeViewSet, basename="node")
router.register("storage-systems", views.StorageSystemViewSet, basename="storage-system")
router.register("campaigns", views.CampaignViewSet, basename="campaign")
router.register("runs", views.RunViewSet, basename="run")
router.register("results", views.ResultViewSet, basename="result")

app_name = "api"
urlpatterns = [
    path("campaigns/<int:pk>/launch/", views.CampaignLaunchView.as_view(), name="campaign-launch"),
    path("campaigns/<int:pk>/cancel/", views.CampaignCancelView.as_view(), name="campaign-cancel"),
    path("", include(router.urls)),
]
