"""Running the application: bind its deployments, start a Ray cluster and Serve.

Contract of this layer (imports ray; ``runtime.serve`` imports it on demand):
``build_app(config)`` is the application (app.py's ``Replica`` per device behind one
``Ingress``); ``app_builder(args)`` the same for Ray Serve's own tools (``serve run``,
``serve deploy``); ``start(config)`` runs it on the Ray cluster this process is
connected to, or on a local (embedded) one it starts with ``init_local``, and returns
the ingress handle.
"""

import logging
import os
import time
from typing import Any

import ray
from ray import serve

from .app import Ingress, Replica, replica_name
from .config import ServeConfig

LOG = logging.getLogger("duplexcadence.serve")


def build_app(config: ServeConfig) -> Any:
    """The application: ``config.replicas`` replica deployments behind one ingress."""
    opts = {"num_gpus": config.gpus_per_replica, "num_cpus": config.cpus_per_replica}
    replicas = [
        Replica.options(
            name=replica_name(i),
            num_replicas=1,
            ray_actor_options=opts,
            max_ongoing_requests=config.max_sessions + 8,  # every session's step + the watch
            health_check_period_s=1.0,
        ).bind(config)
        for i in range(config.replicas)
    ]
    return Ingress.options(ray_actor_options={"num_cpus": 0}).bind(config, *replicas)


def app_builder(args: dict) -> Any:
    """The application for Ray Serve's own tools: ``serve run
    duplexcadence.runtime.serve.launch:app_builder contract=... model=... replicas=2``, or a
    config file's ``import_path`` with its ``args`` (``serve deploy`` on a running cluster;
    docs/serve_token2wav.yaml). ``args`` are ServeConfig's settings; give ``name`` the
    application's name, which a SessionClient looks the replicas up by."""
    return build_app(ServeConfig.from_args(args))


def init_local(
    *,
    num_cpus: int | None = None,
    object_store_mib: int | None = None,
    paths: tuple = (),
    shared_host: bool = False,
    log_to_driver: bool = True,
) -> None:
    """An embedded Ray cluster on this machine (no dashboard). ``paths`` go on the
    workers' PYTHONPATH in front of the driver's (user code that is not installed: a
    ``--model`` module in a checkout); ``shared_host``: Ray's memory monitor off — it
    counts the whole node and would kill replicas for memory other programs use."""
    if shared_host:
        os.environ["RAY_memory_monitor_refresh_ms"] = "0"
    pythonpath = os.pathsep.join([*map(str, paths), *filter(None, [os.environ.get("PYTHONPATH")])])
    ray.init(
        address="local",
        include_dashboard=False,
        num_cpus=num_cpus,
        object_store_memory=None if object_store_mib is None else object_store_mib * 2**20,
        runtime_env={"env_vars": {"PYTHONPATH": pythonpath}} if pythonpath else None,
        log_to_driver=log_to_driver,
    )


def start(
    config: ServeConfig,
    *,
    http_port: int | None = None,
    host: str = "127.0.0.1",
    route_prefix: str = "/",
) -> Any:
    """Run the application and return its ingress handle. Starts an embedded local Ray
    cluster unless one is initialised; ``http_port`` None serves handles only;
    ``route_prefix``: where its HTTP routes hang (``/sessions`` under it), one per
    application on a cluster."""
    if not ray.is_initialized():
        init_local()
    if http_port is None:
        serve.start(proxy_location="Disabled")
    else:
        serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": http_port})
    t = time.perf_counter()
    handle = serve.run(
        build_app(config),
        name=config.name,
        route_prefix=route_prefix,  # another application on the cluster needs its own
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
    )
    LOG.info("%s up in %.1f s", config.name, time.perf_counter() - t)
    return handle
