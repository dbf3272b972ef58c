from django.urls import path

from inventory import views

app_name = "inventory"
urlpatterns = [
    path("nodes/", views.node_list, name="node-list"),
    path("nodes/<int:pk>/", views.node_detail, name="node-detail"),
    path("nodes/<int:pk>/collect-facts/", views.node_collect_facts, name="node-collect-facts"),
    path("storage/", views.storage_list, name="storage-list"),
]
