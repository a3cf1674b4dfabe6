"""``embedgate deploy``: complete deployments of exported models, derived from their manifests.

* :mod:`embedgate.deploy.plan`: the models, the hosts layout filters place their servables on, the TF Serving tag;
* :mod:`embedgate.deploy.compose`: a docker compose project; :mod:`embedgate.deploy.helm`: Helm values;
* :mod:`embedgate.deploy.files`: deterministic YAML, config validation by the processes' loaders, writing.
"""

from __future__ import annotations

__all__: list[str] = []
