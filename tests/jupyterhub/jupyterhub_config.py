# A real JupyterHub (PyPI `jupyterhub`) for the tests of the booking page's "Sign in
# with JupyterHub" (booking-api/tests/it/hub_login.rs). Everything test-specific
# comes from the environment the test sets:
#   HUB_PORT          the hub's own port on 127.0.0.1 (the browser and the API reach it there)
#   HUB_DIR           a temporary folder for its database and cookie secret
#   BOOKING_URL       the booking page's address (the service's url and redirect URI)
#   BOOKING_SECRET    the service's api_token, which the hub takes as its OAuth client secret
#   HUB_PASSWORD      every user's password (SharedPasswordAuthenticator, 8+ characters)
# The service entry is the one examples/jupyterhub/z2jh-values.yaml registers.
import os

from jupyterhub.proxy import Proxy


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


c = get_config()  # noqa: F821 (JupyterHub's config loader defines it)
hub_dir = os.environ["HUB_DIR"]
booking = os.environ["BOOKING_URL"].rstrip("/")

c.JupyterHub.proxy_class = NoProxy
# Its warnings and errors only, on the test's stderr.
c.Application.log_level = "WARN"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{os.environ['HUB_PORT']}"
c.JupyterHub.db_url = f"sqlite:///{hub_dir}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = f"{hub_dir}/cookie_secret"
c.JupyterHub.pid_file = f"{hub_dir}/jupyterhub.pid"
c.JupyterHub.cleanup_servers = False
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = os.environ["HUB_PASSWORD"]
c.Authenticator.allow_all = True
c.JupyterHub.load_groups = {
    "gpu-admins": {"users": ["carol"]},
    "ml-lab": {"users": ["alice", "carol"]},
}
# Users may reach the service (its OAuth included): without this scope the hub
# answers the page's sign-in with 403 "You do not have permission to access
# JupyterHub service gpu-booking".
c.JupyterHub.load_roles = [
    {"name": "user", "scopes": ["self", "access:services!service=gpu-booking"]},
]
c.JupyterHub.services = [
    {
        "name": "gpu-booking",
        "url": booking,
        "api_token": os.environ["BOOKING_SECRET"],
        "oauth_redirect_uri": f"{booking}/login/hub/callback",
        "oauth_no_confirm": True,
        "display": True,
    }
]
