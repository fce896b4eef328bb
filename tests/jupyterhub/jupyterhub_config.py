# A real JupyterHub (PyPI `jupyterhub`) for the tests that put the hub in the loop
# (tests/support/jupyterhub.rs starts it). Everything test-specific comes from the
# environment it sets:
#   HUB_PORT              the hub's own port on 127.0.0.1 (the browser and the API reach it there)
#   HUB_DIR               a temporary folder for its database, cookie secret and servers
#   HUB_PASSWORD          every user's password (SharedPasswordAuthenticator, 8+ characters)
#   BOOKING_URL           the booking page's address (the service's url and redirect URI);
#                         unset: no `gpu-booking` service
#   HUB_BOOKING_SECRET    that service's api_token, the hub's OAuth client secret for it
#   HUB_CONTROLLER_TOKEN  the api_token of the controller's service (role: docs/controller.md)
#   HUB_READ_ONLY_TOKEN   the api_token of a service that may only read users
#   HUB_ADMIN_TOKEN       the api_token of the hub's admin service (creates users)
# (each with HUB_ in front: the browser tests' own ADMIN_TOKEN is a booking JWT)
#   HUB_START_SECONDS, HUB_STOP_SECONDS
#                     how long starting and stopping a server take (the hub answers a
#                     start or stop that takes over 10 s with 202 and finishes it later);
#                     with HUB_SPAWNER=kube, how long a server takes to answer once its
#                     pod runs
#   HUB_SPAWNER       `kube`: KubeSpawner (PyPI `jupyterhub-kubespawner`) spawns into the
#                     cluster of KUBECONFIG, as zero-to-jupyterhub configures it (namespace
#                     `jhub`, the kubeconfig's user being the hub's ServiceAccount), one
#                     GPU per server, servers left running when the hub stops (z2jh's
#                     cleanup_servers); unset: the StandInSpawner below
#   HUB_POD_GRACE_SECONDS  with HUB_SPAWNER=kube: the notebook pods' grace period
#                     (Kubernetes' default: 30 s)
#   HUB_POLL_SECONDS  how often the hub polls each server (JupyterHub's default: 30)
#   GPU_BOOKING_URL   with HUB_SPAWNER=kube: the spawn form offers the profiles of
#                     docs/jupyterhub/gpu_booking_profiles.py (which reads it and
#                     GPU_BOOKING_TOKEN), the GPU only in its GPU profile
# The `gpu-booking` entry is the one examples/jupyterhub/jupyterhub-values.yaml registers.
import asyncio
import os
import signal
import sys
import threading
import time

from jupyterhub.proxy import Proxy
from jupyterhub.spawner import Spawner


class NoProxy(Proxy):
    """The routing table kept in memory: the tests reach the hub on its own port,
    and nothing is proxied (configurable-http-proxy is not needed)."""

    should_start = False
    routes = {}

    async def add_route(self, routespec, target, data):
        self.routes[routespec] = {"routespec": routespec, "target": target, "data": data}

    async def delete_route(self, routespec):
        self.routes.pop(routespec, None)

    async def get_all_routes(self):
        return dict(self.routes)


class StandInSpawner(Spawner):
    """A single-user server stand-in: a server in the hub's own event loop on a free
    port, answering every request 200 (any answer tells the hub it is up), so that it
    ends with the hub however the hub ends (a test's kill included); stopped as
    slowly as HUB_STOP_SECONDS says."""

    async def start(self):
        await asyncio.sleep(float(os.environ.get("HUB_START_SECONDS", "0")))
        self.stand_in = await asyncio.start_server(_answer_ok, "127.0.0.1", 0)
        port = self.stand_in.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def poll(self):
        # `self.server` is the hub's record of the server: ours has its own name.
        server = getattr(self, "stand_in", None)
        return None if server is not None and server.is_serving() else 0

    async def stop(self, now=False):
        await asyncio.sleep(float(os.environ.get("HUB_STOP_SECONDS", "0")))
        server = getattr(self, "stand_in", None)
        if server is not None:
            server.close()
            await server.wait_closed()
            self.stand_in = None


if os.environ.get("HUB_SPAWNER") == "kube":
    from kubespawner import KubeSpawner

    class LabKubeSpawner(KubeSpawner):
        """KubeSpawner, its server answering HUB_START_SECONDS after its pod runs, as
        jupyterhub-singleuser takes seconds to start where the lab's stand-in answers
        at once. The hub's spawn progress shows the pod's Events only while the spawn
        lasts: it polls them every second and stops when the server answers."""

        async def start(self):
            url = await super().start()
            await asyncio.sleep(float(os.environ.get("HUB_START_SECONDS", "0")))
            return url


async def _answer_ok(reader, writer):
    try:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()


def _exit_with_parent():
    """Stops the hub (SIGTERM, an orderly shutdown) once the process that started it
    is gone, however it ended: a test or demo killed outright leaves no hub behind."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()


_exit_with_parent()
c = get_config()  # noqa: F821 (JupyterHub's config loader defines it)
hub_dir = os.environ["HUB_DIR"]

c.JupyterHub.proxy_class = NoProxy
# Its warnings and errors only, on the test's stderr.
c.Application.log_level = "WARN"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{os.environ['HUB_PORT']}"
c.JupyterHub.db_url = f"sqlite:///{hub_dir}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = f"{hub_dir}/cookie_secret"
c.JupyterHub.pid_file = f"{hub_dir}/jupyterhub.pid"
c.JupyterHub.cleanup_servers = True
c.JupyterHub.allow_named_servers = True
c.Spawner.start_timeout = 30
if os.environ.get("HUB_SPAWNER") == "kube":
    # The notebook pods as the fixtures in tests/fixtures/kubespawner record them
    # (their README lists these settings).
    c.JupyterHub.spawner_class = LabKubeSpawner
    c.KubeSpawner.namespace = "jhub"
    c.KubeSpawner.image = "quay.io/jupyter/pytorch-notebook:cuda12-2024-10-14"
    c.KubeSpawner.cpu_limit = 4
    c.KubeSpawner.cpu_guarantee = 1
    c.KubeSpawner.mem_limit = "16G"
    c.KubeSpawner.mem_guarantee = "4G"
    if "GPU_BOOKING_URL" in os.environ:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../docs/jupyterhub"))
        from gpu_booking_profiles import gpu_booking_profiles

        c.KubeSpawner.profile_list = gpu_booking_profiles
    else:
        c.KubeSpawner.extra_resource_limits = {"nvidia.com/gpu": "1"}
        c.KubeSpawner.extra_resource_guarantees = {"nvidia.com/gpu": "1"}
    c.KubeSpawner.start_timeout = 60
    c.KubeSpawner.http_timeout = 60
    # z2jh's: a hub restart (an upgrade, a new hub pod) leaves the servers running.
    c.JupyterHub.cleanup_servers = False
else:
    c.JupyterHub.spawner_class = StandInSpawner
if "HUB_POD_GRACE_SECONDS" in os.environ:
    # The grace period of the lab's notebooks (z2jh: singleuser.extraPodConfig).
    c.KubeSpawner.extra_pod_config = {
        "terminationGracePeriodSeconds": int(os.environ["HUB_POD_GRACE_SECONDS"])
    }
if "HUB_POLL_SECONDS" in os.environ:
    c.Spawner.poll_interval = int(os.environ["HUB_POLL_SECONDS"])
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = os.environ["HUB_PASSWORD"]
c.Authenticator.allow_all = True
c.JupyterHub.load_groups = {
    "gpu-admins": {"users": ["carol"]},
    "ml-lab": {"users": ["alice", "carol"]},
}
c.JupyterHub.services = [
    {"name": "gpu-booking-controller", "api_token": os.environ["HUB_CONTROLLER_TOKEN"]},
    {"name": "no-servers-scope", "api_token": os.environ["HUB_READ_ONLY_TOKEN"]},
    {"name": "lab-admin", "api_token": os.environ["HUB_ADMIN_TOKEN"]},
]
c.JupyterHub.load_roles = [
    # docs/controller.md: the controller's role for `--on-expiry hub-restart`.
    {"name": "gpu-booking", "scopes": ["servers"], "services": ["gpu-booking-controller"]},
    {"name": "read-only", "scopes": ["read:users"], "services": ["no-servers-scope"]},
    {"name": "admin", "services": ["lab-admin"]},
]
if "BOOKING_URL" in os.environ:
    booking = os.environ["BOOKING_URL"].rstrip("/")
    c.JupyterHub.services.append({
        "name": "gpu-booking",
        "url": booking,
        "api_token": os.environ["HUB_BOOKING_SECRET"],
        "oauth_redirect_uri": f"{booking}/login/hub/callback",
        "oauth_no_confirm": True,
        "display": True,
    })
    # Users may reach the service (its OAuth included): without this scope the hub
    # answers the page's sign-in with 403 "You do not have permission to access
    # JupyterHub service gpu-booking".
    c.JupyterHub.load_roles.append(
        {"name": "user", "scopes": ["self", "access:services!service=gpu-booking"]})
    # The booking service reads the hub's groups (--hub-groups-token-file with the
    # service's token), as examples/jupyterhub/jupyterhub-values.yaml grants it.
    c.JupyterHub.load_roles.append({
        "name": "gpu-booking-groups",
        "scopes": ["list:groups", "read:groups"],
        "services": ["gpu-booking"],
    })
