"""KubeSpawner ``profile_list`` callable: the spawn form shows which GPU models are
free now and the user's booking, from gpu-booking's ``GET /api/v1/availability``.

Use it in JupyterHub's configuration (zero-to-jupyterhub: ``hub.extraFiles`` to mount
this file, ``hub.extraConfig`` to load it)::

    import sys; sys.path.insert(0, "/usr/local/etc/jupyterhub/gpu-booking")
    from gpu_booking_profiles import gpu_booking_profiles
    c.KubeSpawner.profile_list = gpu_booking_profiles

Settings (environment of the hub):

- ``GPU_BOOKING_URL``: the booking service, e.g. ``http://gpu-booking-api.gpu-booking:8080``
- ``GPU_BOOKING_TOKEN_FILE`` (or ``GPU_BOOKING_TOKEN``): a token with the ``service``
  role (``gpu-booking token --user jupyterhub --role service``), which may ask about
  any user
- ``GPU_BOOKING_PAGE``: the booking page's address shown to users (default: the URL)

Only the standard library is used. When the service cannot be reached the form still
offers the GPU profile, saying that availability is unknown: the webhook decides at
spawn time in any case (booked model, a lent GPU, or CPU only).

``python3 gpu_booking_profiles.py --self-test`` prints the profiles for
``SELF_TEST_USER`` as JSON (the repository's tests run it against a real API).
"""

import asyncio
import json
import os
import urllib.parse
import urllib.request

TIMEOUT_SECONDS = 3
GPU_LIMITS = {"nvidia.com/gpu": "1"}


def _settings():
    url = os.environ.get("GPU_BOOKING_URL", "http://gpu-booking-api.gpu-booking:8080").rstrip("/")
    token = os.environ.get("GPU_BOOKING_TOKEN")
    token_file = os.environ.get("GPU_BOOKING_TOKEN_FILE")
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            token = f.read().strip()
    return url, token, os.environ.get("GPU_BOOKING_PAGE", url)


def fetch_availability(user):
    """``GET /api/v1/availability?user=USER`` (blocking; run it off the event loop)."""
    url, token, _ = _settings()
    query = urllib.parse.urlencode({"user": user})
    request = urllib.request.Request(
        f"{url}/api/v1/availability?{query}",
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as answer:
        return json.load(answer)


def _day(timestamp):
    # RFC 3339 from the API; the form shows it to the minute, in UTC.
    return timestamp[:16].replace("T", " ") + " UTC"


def profiles_for(availability, page):
    """The profile list for one availability answer (pure: easy to test)."""
    active = availability.get("active")
    upcoming = availability.get("next")
    free = [m for m in availability.get("models", []) if m.get("free_now", 0) > 0]
    later = f" Your next booking: {upcoming['model']} from {_day(upcoming['start'])}." if upcoming else ""
    if active:
        gpu = {
            "display_name": f"Your booked {active['model']} GPU (until {_day(active['end'])})",
            "description": f"Booked for you; the notebook loses the GPU when the booking ends.{later}",
            "default": True,
        }
    elif free:
        counts = ", ".join(f"{m['name']}: {m['free_now']} of {m['units']} free" for m in free)
        gpu = {
            "display_name": f"One GPU, lent ({counts})",
            "description": "Without a booking: a free GPU that a booked user may take back "
            f"(you are told when that happens). Book one at {page}.{later}",
        }
    else:
        gpu = {
            "display_name": "One GPU: none free now, the notebook will run on CPU",
            "description": f"Every GPU is in use or booked. Book one at {page}.{later}",
        }
    gpu["kubespawner_override"] = {"extra_resource_limits": dict(GPU_LIMITS)}
    cpu = {"display_name": "CPU only", "default": not active}
    return [gpu, cpu]


async def gpu_booking_profiles(spawner):
    """KubeSpawner's ``profile_list`` callable: called with the spawner per form."""
    _, _, page = _settings()
    loop = asyncio.get_running_loop()
    try:
        availability = await loop.run_in_executor(None, fetch_availability, spawner.user.name)
    except Exception as e:  # the form must render whatever the booking service does
        spawner.log.warning("gpu-booking availability unavailable: %s", e)
        return [
            {
                "display_name": "One GPU (availability unknown right now)",
                "description": f"Your booking decides which GPU you get; see {page}.",
                "kubespawner_override": {"extra_resource_limits": dict(GPU_LIMITS)},
            },
            {"display_name": "CPU only", "default": True},
        ]
    return profiles_for(availability, page)


if __name__ == "__main__":
    import sys
    import types

    if sys.argv[1:] != ["--self-test"]:
        sys.exit("usage: gpu_booking_profiles.py --self-test  (SELF_TEST_USER, GPU_BOOKING_URL, GPU_BOOKING_TOKEN)")
    spawner = types.SimpleNamespace(
        user=types.SimpleNamespace(name=os.environ["SELF_TEST_USER"]),
        log=types.SimpleNamespace(warning=lambda msg, *a: print(msg % a, file=sys.stderr)),
    )
    print(json.dumps(asyncio.run(gpu_booking_profiles(spawner))))
