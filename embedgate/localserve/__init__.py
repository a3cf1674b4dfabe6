"""``embedgate serve-local``: TF-Serving-compatible gRPC server over the exported SavedModels.

Import the submodules directly (``embedgate.localserve.server`` etc.); this package imports nothing at import time
so ``embedgate.cli`` stays fast.
"""

__all__: list[str] = []
