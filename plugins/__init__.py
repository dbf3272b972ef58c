"""The plug-ins and pure planning: benchmark kinds, container runtimes, launchers, mounts and the helper programs
shipped to nodes. Nothing here touches SSH or the database; previews, execution and tests share it."""
