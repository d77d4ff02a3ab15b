"""The engine: options, the decode loop, acceptance rules, rollback, the step log, draft-length policies
(other engines' registered by name from ``specbench.core.peer_policies``)."""

import specbench.core.peer_policies  # noqa: F401  (registers other engines' policies by name)
