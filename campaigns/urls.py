from django.urls import path

from campaigns import views

app_name = "campaigns"
urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("campaigns/", views.campaign_list, name="campaign-list"),
    path("campaigns/new/", views.campaign_new, name="campaign-new"),
    path("campaigns/new/preview/", views.campaign_new_preview, name="campaign-new-preview"),
    path("campaigns/new/fio/", views.campaign_new_fio, name="campaign-new-fio"),
    path("campaigns/<int:pk>/", views.campaign_detail, name="campaign-detail"),
    path("campaigns/<int:pk>/preview/", views.campaign_preview, name="campaign-preview"),
    path("campaigns/<int:pk>/yaml/", views.campaign_yaml, name="campaign-yaml"),
    path("campaigns/<int:pk>/launch/", views.campaign_launch, name="campaign-launch"),
    path("campaigns/<int:pk>/cancel/", views.campaign_cancel, name="campaign-cancel"),
    path("campaigns/<int:pk>/rerun-failed/", views.campaign_rerun_failed, name="campaign-rerun-failed"),
    path("runs/<int:pk>/", views.run_detail, name="run-detail"),
    path("runs/<int:pk>/hosts/<int:host_pk>/log.txt", views.run_host_log, name="run-host-log"),
]
