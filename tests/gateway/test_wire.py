"""Our protos (schemas.proto.tfs_pb2) and the official tensorflow-serving-api messages are byte-compatible."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.codec.tensor import from_ndarray, to_ndarray
from schemas.proto import tfs_pb2

official = pytest.importorskip("tensorflow_serving.apis.predict_pb2")


def test_predict_request_round_trip() -> None:
    from tensorflow.core.framework import types_pb2

    ours = tfs_pb2.PredictRequest()
    ours.model_spec.name = "m"
    ours.model_spec.version.value = 7
    ours.model_spec.signature_name = "serving_default"
    ours.inputs["x"].CopyFrom(from_ndarray(np.array([[1.5, 2.0]], dtype=np.float32)))
    ours.inputs["s"].CopyFrom(from_ndarray(np.array([b"a"], dtype=object)))
    theirs = official.PredictRequest.FromString(ours.SerializeToString())
    assert theirs.model_spec.name == "m" and theirs.model_spec.version.value == 7
    assert theirs.inputs["x"].dtype == types_pb2.DT_FLOAT
    assert [d.size for d in theirs.inputs["x"].tensor_shape.dim] == [1, 2]
    assert theirs.inputs["s"].string_val == [b"a"]
    back = tfs_pb2.PredictRequest.FromString(theirs.SerializeToString())
    assert back == ours


def test_predict_response_typed_fields_decode() -> None:
    resp = official.PredictResponse()
    t = resp.outputs["y"]
    t.dtype = 1
    t.tensor_shape.dim.add().size = 2
    t.float_val.extend([0.5, 1.5])
    resp.model_spec.version.value = 3
    ours = tfs_pb2.PredictResponse.FromString(resp.SerializeToString())
    assert to_ndarray(ours.outputs["y"]).tolist() == [0.5, 1.5] and ours.model_spec.version.value == 3


def test_label_metadata_status_classify_regress() -> None:
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        regression_pb2,
    )

    spec = tfs_pb2.ModelSpec(name="m", version_label="stable")
    req = get_model_metadata_pb2.GetModelMetadataRequest.FromString(
        tfs_pb2.GetModelMetadataRequest(model_spec=spec, metadata_field=["signature_def"]).SerializeToString()
    )
    assert req.model_spec.version_label == "stable" and list(req.metadata_field) == ["signature_def"]

    sigmap = get_model_metadata_pb2.SignatureDefMap()
    sigmap.signature_def["serving_default"].inputs["x"].dtype = 9
    meta = get_model_metadata_pb2.GetModelMetadataResponse()
    meta.metadata["signature_def"].Pack(sigmap)
    ours = tfs_pb2.GetModelMetadataResponse.FromString(meta.SerializeToString())
    parsed = tfs_pb2.SignatureDefMap.FromString(ours.metadata["signature_def"].value)
    assert parsed.signature_def["serving_default"].inputs["x"].dtype == tfs_pb2.DataType.DT_INT64

    status = get_model_status_pb2.GetModelStatusResponse()
    v = status.model_version_status.add()
    v.version, v.state = 2, 30
    assert (
        tfs_pb2.GetModelStatusResponse.FromString(status.SerializeToString()).model_version_status[0].state
        == 30
    )

    c = classification_pb2.ClassificationResponse()
    c.result.classifications.add().classes.add(label="a", score=0.5)
    got = tfs_pb2.ClassificationResponse.FromString(c.SerializeToString())
    assert got.result.classifications[0].classes[0].label == "a"
    r = regression_pb2.RegressionResponse()
    r.result.regressions.add(value=1.5)
    assert tfs_pb2.RegressionResponse.FromString(r.SerializeToString()).result.regressions[0].value == 1.5
