"""fio plug-in (being written)."""
