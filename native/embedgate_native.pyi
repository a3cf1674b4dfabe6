"""Types of the compiled module ``embedgate_native`` (``native/src/lib.rs``); import it through ``gateway.native``."""

from collections.abc import Sequence

import numpy as np

def version() -> str: ...
def predict_tensors(
    body: bytes, names: list[str], dtypes: list[int]
) -> tuple[dict[str, np.ndarray], str] | None: ...

# the signature name is its size (an int) when it has more than max_name UTF-8 bytes
def check_predict(
    body: bytes, max_depth: int, max_instances: int, max_ids: int, max_name: int
) -> tuple[str | int, CheckedBody] | None: ...

class CheckedBody:
    def tensors(self, names: list[str], dtypes: list[int]) -> tuple[dict[str, np.ndarray], str] | None: ...

# native/src/response.rs: TF Serving's JSON response writer
def predict_response(
    outputs: list[tuple[str, list[int], np.ndarray | list[bytes]]], row: bool
) -> bytes | None: ...
def regress_response(values: list[float]) -> bytes: ...
def classify_response(labels: list[bytes], scores: list[float], counts: list[int]) -> bytes: ...
def format_float(v: float, double: bool = False, exact: bool = False) -> str: ...
def plan_lookups(
    ids: list[np.ndarray], tables: list[int], num_tables: int, num_shards: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

class SlotIndex:
    def __init__(self) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, id: int) -> bool: ...
    def __setitem__(self, id: int, slot: int) -> None: ...
    def __getitem__(self, id: int) -> int: ...
    def get(self, id: int, default: int | None = None) -> int | None: ...
    def pop(self, id: int, default: int | None = None) -> int | None: ...
    def slots(self, ids: np.ndarray, missing: int) -> np.ndarray: ...
    def read(
        self, ids: np.ndarray, rows: np.ndarray, used: np.ndarray, tick: int
    ) -> tuple[np.ndarray, np.ndarray]: ...

def pool_feature(
    table: np.ndarray,
    rows: np.ndarray,
    row_splits: np.ndarray | None,
    weights: np.ndarray | None,
    combiner: int,
) -> np.ndarray: ...

# native/src/features.rs: REST features of an embedding model -> FeatureBatch arrays
class FeatureLayout:
    def __init__(self, sparse: list[tuple[str, bool, int, str]], dense: list[tuple[str, int]]) -> None: ...

def checked_features(
    checked: CheckedBody, layout: FeatureLayout
) -> tuple[bool, int, list[tuple[np.ndarray, np.ndarray, np.ndarray | None]], list[np.ndarray]] | None: ...
def body_features(
    body: bytes, layout: FeatureLayout
) -> tuple[bool, int, list[tuple[np.ndarray, np.ndarray, np.ndarray | None]], list[np.ndarray]] | None: ...

# native/src/rest_body.rs: an embedding model's REST body in one pass (limits + signature_name + features)
def rest_features(
    body: bytes, layout: FeatureLayout, max_depth: int, max_instances: int, max_ids: int, max_name: int
) -> (
    tuple[
        str | int, tuple[bool, int, list[tuple[np.ndarray, np.ndarray, np.ndarray | None]], list[np.ndarray]]
    ]
    | None
): ...

# native/src/entry.rs: the entry's serialized PredictRequest in one pass
def entry_request(head: bytes, inputs: list[tuple[str, int, list[int], list[np.ndarray]]]) -> bytes: ...

# native/src/scan.rs: is a serialized PredictRequest plain (parsed in a few copies)?
def plain_predict_request(raw: bytes) -> bool: ...

# native/src/predict_req.rs: a received PredictRequest split into (rest, [(alias, dtype, dims, offset, length)])
def split_predict_request(raw: bytes) -> tuple[bytes, list[tuple[str, int, list[int], int, int]]] | None: ...

class DirectCall:
    @property
    def path(self) -> str: ...
    @property
    def received(self) -> bool: ...
    @property
    def cancelled(self) -> bool: ...
    def metadata(self) -> list[tuple[str, bytes]]: ...
    def time_remaining(self) -> float | None: ...
    def take_message(self) -> bytes: ...
    def respond(
        self, code: int, details: str, body: bytes | None = ..., trailers: list[tuple[str, str]] = ...
    ) -> bool: ...

class GrpcGate:
    def __init__(
        self,
        host: str,
        port: int,
        upstream: str,
        capacity: int,
        max_in_flight: int,
        max_lag_text: str,
        status: int,
        direct: list[str] = ...,
        max_message: int = ...,
        max_calls: int = ...,
        reuse_port: bool = ...,
        stream_window: int = ...,
        max_bytes: int = ...,
        bytes_text: str = ...,
        receive_timeout_s: float = ...,
        timeout_text: str = ...,
        tokens: list[bytes] | None = ...,
    ) -> None: ...
    @property
    def port(self) -> int: ...
    def next_call(self, timeout_s: float) -> DirectCall | None: ...
    def set_tokens(self, tokens: list[bytes] | None) -> None: ...
    @property
    def relayed(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def set_state(
        self,
        reason: int,
        in_flight: int,
        limit: int,
        waiting: int,
        lag_ms: int,
        capacity: int,
        room: int = ...,
        pending: int = ...,
    ) -> None: ...
    def take_refused(self) -> tuple[int, int, int, int]: ...
    def close(self, grace_s: float) -> None: ...

class RestGate:
    def __init__(
        self,
        host: str,
        port: int,
        upstream: str,
        capacity: int,
        max_in_flight: int,
        max_lag_text: str,
        status: int,
        retry_after: int,
        keep_alive_s: float = ...,
        reuse_port: bool = ...,
    ) -> None: ...
    @property
    def port(self) -> int: ...
    @property
    def relayed(self) -> int: ...
    @property
    def unseen(self) -> int: ...
    def set_state(
        self,
        reason: int,
        in_flight: int,
        limit: int,
        waiting: int,
        lag_ms: int,
        capacity: int,
        room: int = ...,
        pending: int = ...,
    ) -> None: ...
    def seen(self) -> None: ...
    def take_refused(self) -> tuple[int, int, int]: ...
    def close(self, grace_s: float) -> None: ...

class GrpcClient:
    def __init__(self, max_receive: int = ..., window: int = ...) -> None: ...
    def fileno(self) -> int: ...
    def call(self, target: str, path: str, message: bytes, timeout_s: float) -> int: ...
    def cancel(self, token: int) -> None: ...
    def drain(self) -> list[tuple[int, int, str, bytes | None]]: ...
    def running(self) -> int: ...
    def close(self) -> None: ...

# native/src/hot.rs: the all-cached read path of a unique_rows entry in one call
def cached_entry_request(
    head: bytes,
    features: list[
        tuple[int, np.ndarray, str, tuple[str, np.ndarray] | None, tuple[str, np.ndarray | None] | None]
    ],
    tables: list[tuple[str | None, SlotIndex, np.ndarray, np.ndarray]],
    dense: list[tuple[str, np.ndarray]],
    num_shards: int,
    tick: int,
    row_dtype: int,
) -> tuple[bytes, int] | None: ...

# native/src/tensor_features.rs: gRPC Predict features of an embedding model, from the request's bytes
def tensor_features(
    raw: bytes, layout: FeatureLayout
) -> tuple[bool, int, list[tuple[np.ndarray, np.ndarray, np.ndarray | None]], list[np.ndarray]] | None: ...

# native/src/spec_sizes.rs: a request's model_spec string sizes, from the wire format
def spec_too_long(raw: bytes, max_bytes: int, limit: int) -> tuple[int, int] | None: ...

# native/src/shape_check.rs: the bytes a PredictRequest's input tensors decode to, their shapes checked
def predict_input_bytes(
    raw: bytes,
    items: Sequence[int],
    default_item: int,
    max_rank: int,
    max_instances: int,
    max_bytes: int,
) -> int | None: ...
