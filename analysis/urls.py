from django.urls import path

from analysis import views

app_name = "analysis"
urlpatterns = [
    path("compare/", views.compare, name="compare"),
    path("analysis/", views.index, name="index"),
    path("analysis/scaling/", views.scaling, name="scaling"),
    path("analysis/storage/", views.storage, name="storage"),
    path("analysis/sweep/", views.sweep, name="sweep"),
    path("analysis/campaigns/<int:pk>/fleet/", views.fleet_page, name="fleet"),
    path("analysis/campaigns/<int:pk>/links/", views.links_page, name="links"),
    path("analysis/suites/", views.suite_list, name="suites"),
    path("analysis/suite-runs/<str:name>/", views.suite_run_page, name="suite-run"),
    path("analysis/nodes/<str:node>/history/", views.node_history, name="node-history"),
]
