"""Types of the compiled module ``embedgate_native`` (``native/src/lib.rs``); import it through ``gateway.native``."""

import numpy as np

def version() -> str: ...
def predict_tensors(
    body: bytes, names: list[str], dtypes: list[int]
) -> tuple[dict[str, np.ndarray], str] | None: ...
