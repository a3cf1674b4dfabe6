"""Types of the compiled module ``embedgate_native`` (``native/src/lib.rs``); import it through ``gateway.native``."""

import numpy as np

def version() -> str: ...
def predict_tensors(
    body: bytes, names: list[str], dtypes: list[int]
) -> tuple[dict[str, np.ndarray], str] | None: ...
def check_predict(
    body: bytes, max_depth: int, max_instances: int, max_ids: int
) -> tuple[str, CheckedBody] | None: ...

class CheckedBody:
    def tensors(self, names: list[str], dtypes: list[int]) -> tuple[dict[str, np.ndarray], str] | None: ...
