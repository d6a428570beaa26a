"""A small typed client of the flowbeat REST API.

from flowbeat_client import Client

with Client("http://localhost:8000", key) as fb:
    job = fb.jobs.wait(fb.jobs.create("papers-digest", {"since_year": 2023})["id"])
"""

from flowbeat_client.client import Client
from flowbeat_client.errors import FlowbeatApiError, JobWaitTimeout

__all__ = ["Client", "FlowbeatApiError", "JobWaitTimeout"]
