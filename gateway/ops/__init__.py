"""The operations layer: who may call (API keys, tenants, grants), how much (admission, quotas), what is
kept (audit log), and the app's lifecycle around it (drain, lease renewal).

* :mod:`~gateway.ops.config`: ``OpsSettings``, the ``ops`` branch of the settings tree;
* :mod:`~gateway.ops.lifecycle`: ``install_ops(app, settings)`` and the ``OpsRuntime`` on ``app.state.ops``;
* :mod:`~gateway.ops.middleware`: the one ASGI middleware, and the helpers routes call (``admit_choices``,
  ``may_disable_guard``);
* :mod:`~gateway.ops.auth`, :mod:`~gateway.ops.tenants`, :mod:`~gateway.ops.admission`: keys and owners,
  tenant policy, quotas and grants, shared in-flight limits;
* :mod:`~gateway.ops.audit` (the log) and :mod:`~gateway.ops.request_audit` (a request's lines);
* :mod:`~gateway.ops.redis_client`: the loop-bound Redis client they share;
* :mod:`~gateway.ops.cli`: ``nextguard keys ...`` and ``nextguard bench load``.
"""
