"""REST routes: ``v1`` (TF Serving's API) and ``ops`` (probes, metrics)."""
