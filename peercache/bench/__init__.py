"""``peercache-bench``: serve / drive two-host measurements of the GET path."""
