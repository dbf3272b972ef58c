from django.urls import path

from scheduling import views

app_name = "scheduling"
urlpatterns = [
    path("campaigns/<int:pk>/schedule/", views.campaign_schedule, name="campaign-schedule"),
    path("schedules/", views.schedule_list, name="schedule-list"),
    path("schedules/<int:pk>/", views.schedule_detail, name="schedule-detail"),
    path("schedules/<int:pk>/toggle/", views.schedule_toggle, name="schedule-toggle"),
    path("schedules/<int:pk>/delete/", views.schedule_delete, name="schedule-delete"),
    path("timeline/", views.timeline, name="timeline"),
]
