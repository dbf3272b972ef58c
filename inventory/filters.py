"""The node list's filters (a GET form): status, tag, GPU model and a text search."""

from __future__ import annotations

from typing import Any

import django_filters as df
from django.db.models import Q, QuerySet

from inventory.models import Node, NodeStatus, Tag


class NodeFilter(df.FilterSet):
    q = df.CharFilter(method="search", label="Search", help_text="name, address, CPU or GPU model")
    status = df.ChoiceFilter(choices=NodeStatus.choices, empty_label="any")
    tag = df.ModelChoiceFilter(field_name="tags", to_field_name="name", queryset=Tag.objects.none(), empty_label="any")
    gpu_model = df.ChoiceFilter(label="GPU model", empty_label="any", choices=[])

    class Meta:
        model = Node
        fields = ["q", "status", "tag", "gpu_model"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Only what the visible nodes carry: another team's tags and GPU models are not offered.
        self.filters["tag"].queryset = Tag.objects.filter(nodes__in=self.queryset).distinct()
        models = self.queryset.exclude(gpu_model="").order_by("gpu_model").values_list("gpu_model", flat=True)
        self.filters["gpu_model"].extra["choices"] = [(m, m) for m in models.distinct()]

    def search(self, queryset: QuerySet[Node], name: str, value: str) -> QuerySet[Node]:
        words = value.split()
        for word in words:
            queryset = queryset.filter(
                Q(name__icontains=word) | Q(address__icontains=word) | Q(cpu_model__icontains=word)
                | Q(gpu_model__icontains=word)
            )  # fmt: skip
        return queryset
