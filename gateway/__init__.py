"""The REST gateway: TF Serving's REST API in front of plain and entry+PS embedding models. Never imports TensorFlow."""
