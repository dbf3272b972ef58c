from django.urls import path

from campaigns import views

app_name = "campaigns"
urlpatterns = [
    path("", views.campaign_list, name="campaign-list"),
    path("campaigns/new/", views.campaign_new, name="campaign-new"),
    path("campaigns/<int:pk>/", views.campaign_detail, name="campaign-detail"),
    path("campaigns/<int:pk>/preview/", views.campaign_preview, name="campaign-preview"),
    path("campaigns/<int:pk>/launch/", views.campaign_launch, name="campaign-launch"),
    path("campaigns/<int:pk>/cancel/", views.campaign_cancel, name="campaign-cancel"),
    path("runs/<int:pk>/", views.run_detail, name="run-detail"),
    path("runs/<int:pk>/hosts/<int:host_pk>/log.txt", views.run_host_log, name="run-host-log"),
]
