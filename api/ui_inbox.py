"""The dashboard's approvals inbox, ``/ui/approvals``: every gate that waits for a person, as
``GET /v1/approvals`` lists it for the viewer's key, oldest request first, each decided where
it is listed; the decision goes through the same route as the job page's buttons."""

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse

from api.deps import SessionDep
from api.routes.approvals import approvals
from api.ui import Viewer, page

router = APIRouter(prefix="/ui", include_in_schema=False)

INBOX = "/ui/approvals"


@router.get("/approvals", response_class=HTMLResponse)
def inbox(request: Request, viewer: Viewer, session: SessionDep) -> Response:
    waiting = approvals(viewer, session).approvals
    return page(request, "approvals.html", approvals=waiting, back=INBOX)
