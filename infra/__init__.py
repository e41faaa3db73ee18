"""Real local services streamtrain runs on: Kafka (KRaft, jars from Maven Central), etcd, Redis.

`LocalServices` starts, health-checks and stops them as server processes on ports and a data
dir of our choosing, idempotently. `Endpoints` says where each service is for every other
process, honouring `STREAMTRAIN_KAFKA`, `STREAMTRAIN_ETCD` and `STREAMTRAIN_REDIS` to point at
external clusters instead.
"""

from streamtrain.infra.cluster import LocalServices, ServiceStatus
from streamtrain.infra.endpoints import Endpoints, Ports
from streamtrain.infra.errors import InfraError, MissingDependencyError, ServiceStartError

__all__ = [
    "Endpoints",
    "InfraError",
    "LocalServices",
    "MissingDependencyError",
    "Ports",
    "ServiceStartError",
    "ServiceStatus",
]
