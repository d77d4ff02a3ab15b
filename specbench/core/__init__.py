"""The engine: options, the decode loop, acceptance rules, rollback, the step log, draft-length policies
(other engines' registered by name, each by its module in ``specbench.core.peer_policies``)."""
