"""The approval escalation URLs of a profile, checked against the egress policy when the profile
is saved or submitted inline rather than when the escalation is sent."""

import httpx

from service.language.profiles import Profile
from service.platform.egress import EgressPolicy
from service.platform.errors import EgressRefused
from service.platform.settings import Settings


def check_escalation_urls(settings: Settings, profile: Profile) -> None:
    """Refuse, when a profile is saved or submitted inline, an approval's ``escalate_to`` that
    the egress policy would refuse when the escalation is sent, perhaps days later."""
    policy = EgressPolicy.from_settings(settings, "escalation")
    for step in profile.steps:
        if step.approval is None or step.approval.escalate_to is None:
            continue
        try:
            policy.check_url(_parsed(step.approval.escalate_to))
        except EgressRefused as exc:
            details = {**exc.details, "step_id": step.id, "field": "approval.escalate_to"}
            raise type(exc)(f"step {step.id!r} escalate_to: {exc.message}", details) from exc


def _parsed(url: str) -> httpx.URL:
    try:
        return httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise EgressRefused(f"{url!r} is not a usable URL: {exc}", {"url": url}) from exc
