"""Telling a job's owner: a chat webhook routed by user or account, and e-mail over SMTP.

Where a notice goes (gpuheal.core.settings.OwnerSettings):
- **chat**: the route for the job's Slurm user (`user:alice`, or the bare `alice`), else for its
  account (`account:ml-research`: a team's channel), else `"*"`, else GPUHEAL_OWNER_NOTIFY_URL.
  The body is gpuheal's JSON (`generic`) or Slack's incoming-webhook body (`slack`).
- **e-mail**, where an SMTP relay is set: to the job's `--mail-user` (Slurm's default is the bare
  user name, mailed as USER@GPUHEAL_MAIL_DOMAIN) and to an address the job's progress line names
  (`notify=`). Never to a URL a job names: the worker would post wherever a user asks.
- always a structured log line.

Once per notice: every POST carries an Idempotency-Key and every mail a Message-ID made from the
notice's key (one per job, event and recovery run), and a retried activity skips the channels its
earlier attempt heartbeated as delivered.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import smtplib
import ssl
from collections.abc import Sequence
from email import policy
from email.message import EmailMessage
from pathlib import Path
from typing import Protocol

import aiohttp
from temporalio import activity
from temporalio.exceptions import ApplicationError

from gpuheal.clients.proc import heartbeat
from gpuheal.core.jobs import OwnerNotice
from gpuheal.core.settings import OwnerSettings

log = logging.getLogger("gpuheal.owners")
# No `%` or `!` in the local part: a relay's percent hack or bang path would route it elsewhere.
ADDRESS = re.compile(r"^[A-Za-z0-9._+-]{1,64}@[A-Za-z0-9.-]{1,253}\.[A-Za-z]{2,63}$")
BARE_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
TIMEOUT_S = 10.0
LONG_HEADERS = policy.SMTP.clone(max_line_length=998)  # RFC 5322's limit: the key stays readable


class OwnerNotifier(Protocol):
    async def send(self, notice: OwnerNotice) -> str:
        """Deliver the notice; returns where it went (for the incident's record)."""
        ...


def load_routes(value: str | None) -> dict[str, str]:
    """GPUHEAL_OWNER_ROUTES: inline JSON, or the path of a JSON file."""
    if not value:
        return {}
    text = Path(value).read_text() if not value.lstrip().startswith("{") else value
    routes = json.loads(text)
    if not isinstance(routes, dict) or not all(isinstance(v, str) for v in routes.values()):
        raise ValueError("GPUHEAL_OWNER_ROUTES must map `user:NAME`, `account:NAME` or '*' to webhook URLs")
    return {str(k): v for k, v in routes.items()}


def route(routes: dict[str, str], default: str | None, notice: OwnerNotice) -> tuple[str, str] | None:
    """The chat webhook for this notice and which rule chose it: user, account, default."""
    for key, why in (
        (f"user:{notice.user}", "user route"),
        (notice.user, "user route"),
        (f"account:{notice.account}", "account route"),
        ("*", "default route"),
    ):
        if key and not key.endswith(":") and key in routes:
            return routes[key], why
    return (default, "default route") if default else None


def addresses(notice: OwnerNotice, domain: str | None, allowed: Sequence[str] = ()) -> tuple[str, ...]:
    """Where the mail goes: the job's --mail-user (else its user; a bare name at the mail domain)
    and any full address among its recipients (notify=), each once. Only to the allowed domains
    (and their subdomains), by default the mail domain's, and with neither to none: a job names
    any address it likes, and the relay must not mail outside the site for it (`*` allows any,
    said so)."""
    permitted = _permitted(domain, allowed)
    found: list[str] = []
    first = [(one.strip(), True) for one in (notice.mail_user or notice.user).split(",")]
    for one, may_be_bare in [*first, *((r, False) for r in notice.recipients)]:
        if ADDRESS.fullmatch(one):
            address = one
        elif may_be_bare and domain and BARE_USER.fullmatch(one):
            address = f"{one}@{domain}"
        else:
            continue
        at = address.rsplit("@", 1)[1].lower()
        if permitted is not None and not any(at == d or at.endswith("." + d) for d in permitted):
            continue
        if address not in found:
            found.append(address)
    return tuple(found)


def _permitted(domain: str | None, allowed: Sequence[str]) -> tuple[str, ...] | None:
    """The domains mail may go to; None is any (`*` listed); () none (neither a list nor a
    mail domain: fail closed)."""
    listed = [d.strip().lower().lstrip("*@.").rstrip(".") for d in allowed]
    if "*" in (d.strip() for d in allowed):
        return None
    return tuple(dict.fromkeys(d for d in (*listed, (domain or "").lower()) if d))


def mail(notice: OwnerNotice, sender: str, to: Sequence[str]) -> EmailMessage:
    msg = EmailMessage(policy=LONG_HEADERS)
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    name = " ".join(notice.job_name.split())  # a job name is the user's: no header line breaks
    msg["Subject"] = f"[gpuheal] job {notice.job_id} ({name}): {notice.event.replace('_', ' ')}"
    msg["Message-ID"] = f"<{hashlib.sha256(notice.key.encode()).hexdigest()[:32]}@gpuheal>"  # receivers dedupe
    msg["X-Gpuheal-Key"] = notice.key
    facts = [
        f"Job: {notice.job_id} ({notice.job_name}), user {notice.user or '?'}, account {notice.account or '?'}",
        f"Cluster: {notice.cluster}",
        f"Nodes: {', '.join(notice.nodes) or '-'}",
    ]
    if notice.steps_at_risk is not None:
        facts.append(f"Steps at risk: {notice.steps_at_risk}")
    if notice.steps_lost is not None:
        facts.append(f"Steps lost: {notice.steps_lost}")
    msg.set_content(f"{notice.message}\n\n" + "\n".join(facts) + "\n")
    return msg


class OwnerDelivery:
    """Every channel the settings name, each once per notice."""

    def __init__(self, settings: OwnerSettings) -> None:
        self._s = settings
        self._routes = load_routes(settings.routes)
        self._password = settings.smtp_password_file.read_text().strip() if settings.smtp_password_file else None
        if settings.smtp_host and not (settings.mail_domain or settings.mail_allowed_domains()):
            log.warning(
                "owner e-mail: GPUHEAL_SMTP_HOST is set but no domain may be mailed (GPUHEAL_MAIL_DOMAIN or"
                " GPUHEAL_MAIL_ALLOWED_DOMAINS; `*` for any): no owner is e-mailed"
            )

    async def send(self, notice: OwnerNotice) -> str:
        log.info(json.dumps(notice.model_dump(mode="json"), sort_keys=True))
        done = _delivered_before()
        went: list[str] = ["log"]
        chat = route(self._routes, self._s.notify_url, notice)
        if chat is not None:
            if "chat" not in done:
                await self._post(chat[0], notice)
                done.add("chat")
                heartbeat({"delivered": sorted(done)})
            went.append(f"webhook ({chat[1]})")
        to = addresses(notice, self._s.mail_domain, self._s.mail_allowed_domains())
        if self._s.smtp_host and to:
            if "mail" not in done:
                await asyncio.to_thread(self._mail, mail(notice, self._s.mail_from, to))
                done.add("mail")
                heartbeat({"delivered": sorted(done)})
            went.append(f"e-mail to {len(to)} address(es)")
        return ", ".join(went)

    async def _post(self, url: str, notice: OwnerNotice) -> None:
        body = (
            {"text": notice.message, "username": "gpuheal"}
            if self._s.format == "slack"
            else notice.model_dump(mode="json")
        )
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session:
            async with session.post(url, json=body, headers={"Idempotency-Key": notice.key}) as resp:
                if resp.status >= 300:
                    raise RuntimeError(f"owner webhook for {notice.user!r} answered HTTP {resp.status}")

    def _mail(self, msg: EmailMessage) -> None:
        assert self._s.smtp_host is not None
        if self._s.smtp_user and not self._s.smtp_starttls:
            raise ApplicationError(
                "GPUHEAL_SMTP_USER needs GPUHEAL_SMTP_STARTTLS=1: no password in clear", non_retryable=True
            )
        try:
            with smtplib.SMTP(self._s.smtp_host, self._s.smtp_port, timeout=TIMEOUT_S) as smtp:
                if self._s.smtp_starttls:
                    smtp.starttls(context=ssl.create_default_context())  # the relay's certificate is checked
                if self._s.smtp_user and self._password:
                    smtp.login(self._s.smtp_user, self._password)
                smtp.send_message(msg)
        except (smtplib.SMTPRecipientsRefused, smtplib.SMTPSenderRefused) as err:
            raise ApplicationError(f"the mail relay refused the notice: {err}", non_retryable=True) from err
        except smtplib.SMTPResponseException as err:
            if err.smtp_code >= 500:  # permanent: a retry would be refused the same way
                raise ApplicationError(f"the mail relay refused the notice: {err}", non_retryable=True) from err
            raise


def _delivered_before() -> set[str]:
    """The channels an earlier attempt of this activity delivered (from its last heartbeat)."""
    if not activity.in_activity():
        return set()
    for detail in activity.info().heartbeat_details:
        if isinstance(detail, dict) and isinstance(detail.get("delivered"), list):
            return {str(d) for d in detail["delivered"]}
    return set()
