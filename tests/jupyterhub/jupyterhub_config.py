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
#                     start or stop that takes over 10 s with 202 and finishes it later)
#   HUB_SPAWNER       `kube`: KubeSpawner (PyPI `jupyterhub-kubespawner`) spawns into the
#                     cluster of KUBECONFIG, as zero-to-jupyterhub configures it (namespace
#                     `jhub`, the kubeconfig's user being the hub's ServiceAccount), one
#                     GPU per server; unset: the StandInSpawner below
# The `gpu-booking` entry is the one examples/jupyterhub/jupyterhub-values.yaml registers.
import asyncio
import os

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


async def _answer_ok(reader, writer):
    try:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()


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
    c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
    c.KubeSpawner.namespace = "jhub"
    c.KubeSpawner.image = "quay.io/jupyter/pytorch-notebook:cuda12-2024-10-14"
    c.KubeSpawner.cpu_limit = 4
    c.KubeSpawner.cpu_guarantee = 1
    c.KubeSpawner.mem_limit = "16G"
    c.KubeSpawner.mem_guarantee = "4G"
    c.KubeSpawner.extra_resource_limits = {"nvidia.com/gpu": "1"}
    c.KubeSpawner.extra_resource_guarantees = {"nvidia.com/gpu": "1"}
    c.KubeSpawner.start_timeout = 60
    c.KubeSpawner.http_timeout = 60
else:
    c.JupyterHub.spawner_class = StandInSpawner
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
