"""Saved pipelines: save (YAML or JSON), read, list, version history, share, delete, import.

Every pipeline a caller can see is its own, one shared with it, or a shipped profile (owner
``system``); admin keys see every owner's and may name one with ``?owner=``.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from api.deps import Reader, RuntimeDep, SessionDep, SettingsDep, Via, ViaDep, Writer
from api.openapi import errors, read_by_route
from api.schemas import UtcDatetime
from service.catalogue.imports import fetch_url, import_policy, read_import_file
from service.catalogue.pipelines import PipelineView, get_pipeline, list_pipelines, list_versions
from service.catalogue.saving import SaveOutcome, delete_pipeline, save_pipeline, set_share
from service.platform.audit import Target, record, saved_event
from service.platform.auth import Principal
from service.platform.errors import UnsupportedMediaType
from service.platform.errors.imports import ImportRequestInvalid
from service.platform.settings import Settings

router = APIRouter(prefix="/v1/pipelines", tags=["pipelines"])

BODY_MEDIA_TYPES = frozenset(
    {"application/yaml", "application/x-yaml", "text/yaml", "application/json", "text/plain"}
)
OWNER_QUERY = Query(max_length=128, description="another owner's pipeline (admin, or shared)")

_SAVE_REFUSED = (
    "profile_invalid, pipeline_name_mismatch, unknown_action, trigger_cycle, pipeline_cycle, "
    "egress_scheme_refused, egress_host_not_allowed, egress_address_refused: "
    "the egress codes for an approval's escalate_to"
)
_BAD_NAME = "profile_invalid: not a pipeline name"
_NOT_FOUND = errors({404: "pipeline_not_found", 422: _BAD_NAME})
_CHANGE_ERRORS = errors(
    {
        404: "pipeline_not_found",
        409: "pipeline_read_only: a shipped profile is read-only",
        422: _BAD_NAME,
    }
)
_SHARE_ERRORS = {**_CHANGE_ERRORS, **errors({422: "profile_invalid, invalid_share"})}


class PipelinePublic(BaseModel):
    name: str
    owner: str
    description: str
    tags: list[str]
    shared_with: list[str]
    version: int | None = Field(description="null for shipped profiles, which are files")
    content_hash: str
    read_only: bool
    run_count: int
    created_at: UtcDatetime | None
    updated_at: UtcDatetime | None

    @classmethod
    def of(cls, view: PipelineView) -> "PipelinePublic":
        return cls(
            name=view.name,
            owner=view.owner,
            description=view.description,
            tags=view.tags,
            shared_with=view.shared_with,
            version=view.version,
            content_hash=view.content_hash,
            read_only=view.read_only,
            run_count=view.run_count,
            created_at=view.created_at,
            updated_at=view.updated_at,
        )


class PipelineDetail(PipelinePublic):
    profile: dict[str, Any]
    source: str | None = Field(
        default=None,
        description="the YAML or JSON text this version was saved from, comments and all; null "
        "for shipped profiles, text over FLOWBEAT_MAX_BODY_BYTES and versions saved before the "
        "text was kept",
    )


class PipelineEnvelope(BaseModel):
    pipeline: PipelineDetail
    created_version: bool | None = None


class PipelineList(BaseModel):
    pipelines: list[PipelinePublic]


class VersionPublic(BaseModel):
    version: int
    content_hash: str
    created_at: UtcDatetime
    current: bool


class VersionList(BaseModel):
    versions: list[VersionPublic]


class Shares(BaseModel):
    name: str
    shared_with: list[str]


class Deleted(BaseModel):
    name: str
    purged_jobs: int


class ImportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(default=None, max_length=2048)
    path: str | None = Field(default=None, max_length=1024)
    name: str | None = Field(default=None, max_length=64, description="must match the profile")


def _detail(view: PipelineView) -> PipelineDetail:
    return PipelineDetail(
        **PipelinePublic.of(view).model_dump(), profile=view.profile.to_json(), source=view.source
    )


def _admin(principal: Principal) -> bool:
    return principal.has("admin")


async def profile_body(request: Request) -> str:
    """The raw body as text; a route parameter would make FastAPI parse it as JSON only."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type not in BODY_MEDIA_TYPES:
        raise UnsupportedMediaType(
            f"send the profile as YAML or JSON, not {media_type or 'no content type'!r}",
            {"content_type": media_type, "allowed": sorted(BODY_MEDIA_TYPES)},
        )
    raw = await request.body()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UnsupportedMediaType("the body is not UTF-8 text", {}) from None


def _saved(outcome: SaveOutcome, response: Response) -> PipelineEnvelope:
    response.status_code = 201 if outcome.created_version else 200
    return PipelineEnvelope(pipeline=_detail(outcome.view), created_version=outcome.created_version)


@router.get("", response_model=PipelineList)
def index(
    principal: Reader,
    session: SessionDep,
    settings: SettingsDep,
    tag: Annotated[str | None, Query(max_length=64)] = None,
) -> PipelineList:
    views = list_pipelines(
        session,
        viewer=principal.owner,
        profiles_dir=settings.profiles_dir,
        tag=tag or None,
        admin=_admin(principal),
    )
    return PipelineList(pipelines=[PipelinePublic.of(view) for view in views])


@router.post(
    "/import",
    status_code=201,
    response_model=PipelineEnvelope,
    responses={
        200: {"model": PipelineEnvelope},
        **errors(
            {
                403: "imports_disabled, import_host_not_allowed, import_address_refused, "
                "import_redirect_refused, import_path_refused",
                404: "import_not_found",
                409: "pipeline_read_only",
                413: "import_too_large",
                415: "import_content_type_refused",
                422: f"import_request_invalid, import_scheme_refused, {_SAVE_REFUSED}",
                502: "import_fetch_failed",
                504: "import_timeout",
            }
        ),
    },
)
def import_pipeline(
    body: ImportRequest,
    response: Response,
    principal: Writer,
    session: SessionDep,
    runtime: RuntimeDep,
    settings: SettingsDep,
    via: ViaDep,
) -> PipelineEnvelope:
    """Fetch a profile from an allow-listed https URL or a file in the import directory, then
    save it exactly as ``PUT`` would. The authentication's transaction ends first, so no
    database connection is held while a remote server takes its time."""
    if (body.url is None) == (body.path is None):
        raise ImportRequestInvalid("give exactly one of 'url' and 'path'", {})
    session.commit()
    if body.url is not None:
        text = fetch_url(body.url, import_policy(settings))
    else:
        assert body.path is not None
        text = read_import_file(body.path, settings.import_dir, settings.import_max_bytes)
    outcome = save_pipeline(
        session,
        owner=principal.owner,
        name=body.name,
        body=text,
        settings=settings,
        known_actions=runtime.registry.names(),
    )
    if outcome.created_version:
        view = outcome.view
        event = saved_event(view.name, view.owner, view.version, source=body.url or body.path)
        record(session, via.actor(principal), "pipeline.import", *event)
    session.commit()
    return _saved(outcome, response)


PROFILE_BODY = read_by_route(
    {
        "required": True,
        "description": "a profile; its name must be the one in the URL",
        "content": {
            media: {"schema": {"type": "string"}}
            for media in ("application/yaml", "text/yaml", "application/x-yaml", "text/plain")
        }
        | {"application/json": {"schema": {"type": "object"}}},
    }
)


@router.put(
    "/{name}",
    status_code=201,
    response_model=PipelineEnvelope,
    responses={
        200: {"model": PipelineEnvelope},
        **errors(
            {
                409: "pipeline_read_only",
                415: "unsupported_media_type",
                422: _SAVE_REFUSED,
            }
        ),
    },
    openapi_extra=PROFILE_BODY,
)
def save(
    name: str,
    principal: Writer,
    text: Annotated[str, Depends(profile_body)],
    response: Response,
    session: SessionDep,
    runtime: RuntimeDep,
    settings: SettingsDep,
    via: ViaDep,
) -> PipelineEnvelope:
    """201 with a new version; 200 when the content is one already saved (no new version)."""
    outcome = save_pipeline(
        session,
        owner=principal.owner,
        name=name,
        body=text,
        settings=settings,
        known_actions=runtime.registry.names(),
    )
    if outcome.created_version:
        event = saved_event(outcome.view.name, outcome.view.owner, outcome.view.version)
        record(session, via.actor(principal), "pipeline.save", *event)
    session.commit()
    return _saved(outcome, response)


@router.get("/{name}", response_model=PipelineEnvelope, responses=_NOT_FOUND)
def read(
    name: str,
    principal: Reader,
    session: SessionDep,
    settings: SettingsDep,
    version: Annotated[int | None, Query(ge=1)] = None,
    owner: Annotated[str | None, OWNER_QUERY] = None,
) -> PipelineEnvelope:
    """The pipeline with its profile, and the text its version was saved from (``source``)."""
    view = get_pipeline(
        session,
        name,
        viewer=principal.owner,
        profiles_dir=settings.profiles_dir,
        owner=owner,
        version=version,
        admin=_admin(principal),
    )
    return PipelineEnvelope(pipeline=_detail(view))


@router.get("/{name}/versions", response_model=VersionList, responses=_NOT_FOUND)
def versions(
    name: str,
    principal: Reader,
    session: SessionDep,
    owner: Annotated[str | None, OWNER_QUERY] = None,
) -> VersionList:
    found = list_versions(
        session, name, viewer=principal.owner, owner=owner, admin=_admin(principal)
    )
    return VersionList(
        versions=[VersionPublic(**vars(version)) for version in found],
    )


@router.delete("/{name}", response_model=Deleted, responses=_CHANGE_ERRORS)
def remove(
    name: str,
    principal: Writer,
    session: SessionDep,
    settings: SettingsDep,
    via: ViaDep,
    purge_history: bool = False,
    owner: Annotated[str | None, OWNER_QUERY] = None,
) -> Deleted:
    """Deletes the pipeline, its versions and its schedule; its jobs only with
    ``purge_history=true``."""
    purged = delete_pipeline(
        session,
        name,
        viewer=principal.owner,
        profiles_dir=settings.profiles_dir,
        owner=owner,
        admin=_admin(principal),
        purge_history=purge_history,
    )
    detail = {"owner": owner or principal.owner, "purged_jobs": purged}
    record(session, via.actor(principal), "pipeline.delete", Target("pipeline", name), detail)
    session.commit()
    return Deleted(name=name, purged_jobs=purged)


def _share(
    name: str,
    grantee: str,
    *,
    shared: bool,
    owner: str | None,
    principal: Principal,
    session: Session,
    settings: Settings,
    via: Via,
) -> Shares:
    grantees = set_share(
        session,
        name,
        grantee,
        shared=shared,
        viewer=principal.owner,
        profiles_dir=settings.profiles_dir,
        owner=owner,
        admin=_admin(principal),
    )
    action = "pipeline.share" if shared else "pipeline.unshare"
    detail = {"owner": owner or principal.owner, "grantee": grantee}
    record(session, via.actor(principal), action, Target("pipeline", name), detail)
    session.commit()
    return Shares(name=name, shared_with=grantees)


@router.put(
    "/{name}/shares/{grantee}",
    response_model=Shares,
    responses=_SHARE_ERRORS,
)
def share(
    name: str,
    grantee: str,
    principal: Writer,
    session: SessionDep,
    settings: SettingsDep,
    via: ViaDep,
    owner: Annotated[str | None, OWNER_QUERY] = None,
) -> Shares:
    """Let ``grantee`` read and run the pipeline, not change it. Owner or admin only."""
    return _share(
        name,
        grantee,
        shared=True,
        owner=owner,
        principal=principal,
        session=session,
        settings=settings,
        via=via,
    )


@router.delete(
    "/{name}/shares/{grantee}",
    response_model=Shares,
    responses=_SHARE_ERRORS,
)
def unshare(
    name: str,
    grantee: str,
    principal: Writer,
    session: SessionDep,
    settings: SettingsDep,
    via: ViaDep,
    owner: Annotated[str | None, OWNER_QUERY] = None,
) -> Shares:
    return _share(
        name,
        grantee,
        shared=False,
        owner=owner,
        principal=principal,
        session=session,
        settings=settings,
        via=via,
    )
