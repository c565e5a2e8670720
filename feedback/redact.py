"""Secret redaction and the code storage modes, applied to every text before it is written.

`redact(text)` replaces what looks like a credential with `[REDACTED:kind]`. Four detectors read
the same text and return spans:

- blocks: private keys of every armour (PEM, PGP, OpenSSH, SSH2, PuTTY, a PEM inside a JSON string
  with escaped newlines) and the values of a Kubernetes Secret's `data:`;
- tokens: provider tokens with a known shape (the rule set of gitleaks, reworded: AWS, GCP, Azure,
  GitHub, GitLab, Slack, Stripe, Shopify, Twilio, SendGrid, npm, PyPI, Vault, age, JWTs...) and long
  high-entropy strings;
- credentials in place: URLs with any userinfo, `.pgpass` lines, `curl -u user:pass`,
  `mysql -pSECRET`, `docker login -p`;
- assignments to a secret-sounding name in any syntax (code, .env, shell, YAML, TOML, INI, JSON,
  XML, .netrc, command-line flags, HTTP headers), whatever the value's characters. Where a value
  ends and whether it is code (`password = get_password()`, `token = self.token`, `api_key: str`)
  or a literal depends on the syntax, read from the name's line (`_syntax`).

Overlapping spans are merged (redact more, never less) and replaced once. Patterns start on a
literal or behind one cheap check, and every repetition is bounded; the text is scanned in chunks
against a time budget, and what the budget leaves unscanned is replaced whole.

It errs toward redacting: a lost literal in a training example costs little, a leaked key costs a
lot. `RULES_VERSION` changes with the rules, so that a store redacts again what it already holds
(`feedback.store`).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace

__all__ = ["redact", "Redaction", "for_storage", "text_hash", "shannon_entropy", "RULES_VERSION"]

RULES_VERSION = 2
# Past this size a text is not scanned but replaced whole: recording such a text is a mistake anyway.
MAX_SCANNED_CHARS = 32 * 1024 * 1024
_MAX_VALUE = 4096  # a value longer than this is cut there and redacted up to the cut
_CHUNK = 64 * 1024  # characters scanned between two looks at the clock
_OVERLAP = 1024  # how far a match that starts in a chunk may run past it
_PREFIX = 256  # how much of its line before a name is read to judge the syntax
_JUDGED = 256  # how much of a value is read to judge it (a span may be longer)
_BUDGET_S = 2.0  # time allowed to scan a text: this, plus
_BUDGET_S_PER_MB = 1.0  # this per megabyte (about 4x the time realistic code takes on 2 slow cores)

# -- provider tokens -----------------------------------------------------------------------------
# (kind, pattern), after gitleaks' rules (reworded). A token starts where a word starts: `_TOKEN`
# puts all of them behind one "not after a letter or digit" check and is run inside each run of
# token characters (`_RUN`).
_END = r"(?![A-Za-z0-9])"
_TOKENS: tuple[tuple[str, str], ...] = (
    (
        "aws_access_key",
        r"(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|APKA)[A-Z0-9]{16}" + _END,
    ),
    ("aws_bedrock_key", r"ABSK[A-Za-z0-9+/]{100,}={0,2}"),
    ("github_token", r"gh[pousr]_[A-Za-z0-9]{30,255}|github_pat_\w{22,255}"),
    ("gitlab_token", r"gl(?:pat|dt|rt|ptt|ft|imt|agent|oas|soat|ffct|cbt)-[\w-]{20,}|GR1348941[\w-]{20,}"),
    ("slack_token", r"xox[abposre]-[0-9A-Za-z-]{10,}|xapp-\d-[A-Z0-9]+-\d+-[a-z0-9]+"),
    ("slack_webhook", r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/_-]{20,}"),
    ("discord_webhook", r"discord(?:app)?\.com/api/webhooks/\d+/[\w-]{30,}"),
    ("teams_webhook", r"webhook\.office\.com/webhookb2/[\w@/-]{40,}"),
    ("stripe_key", r"(?:sk|rk|pk)_(?:live|test|prod)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9]{24,}"),
    ("shopify_token", r"shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}"),
    ("google_api_key", r"AIza[\w-]{35}"),
    ("google_oauth", r"GOCSPX-[\w-]{24,}|ya29\.[\w-]{20,}|1//0[\w-]{40,}"),
    ("azure_client_secret", r"[\w~.]{3}\dQ~[\w~.-]{31,34}"),
    ("twilio_key", r"SK[0-9a-fA-F]{32}" + _END),
    ("sendgrid_key", r"SG\.[\w-]{16,32}\.[\w-]{16,64}"),
    ("brevo_key", r"x(?:keysib|smtpsib)-[a-f0-9]{64}-[A-Za-z0-9]{16}"),
    ("mailgun_key", r"key-[a-f0-9]{32}" + _END),
    ("mailchimp_key", r"[a-f0-9]{32}-us\d{1,2}" + _END),
    ("heroku_key", r"HRKU-AA[\w-]{58}"),
    ("digitalocean_token", r"do[opr]_v1_[a-f0-9]{64}"),
    ("doppler_token", r"dp\.(?:pt|st|sa|ct|scim|audit)\.(?:[a-z0-9_-]{1,30}\.)?[A-Za-z0-9]{40,44}"),
    ("databricks_token", r"dapi[a-f0-9]{32}(?:-\d)?"),
    ("vault_token", r"hv[sbr]\.[\w-]{24,300}|s\.(?=[A-Za-z]*\d)[A-Za-z0-9]{24}" + _END),
    ("terraform_token", r"[A-Za-z0-9]{14}\.atlasv1\.[\w=-]{60,70}"),
    ("npm_token", r"npm_[A-Za-z0-9]{36}"),
    ("pypi_token", r"pypi-[\w-]{50,}"),
    ("rubygems_token", r"rubygems_[a-f0-9]{48}"),
    ("nuget_key", r"oy2[a-z0-9]{43}" + _END),
    ("docker_token", r"dckr_pat_[\w-]{27,}"),
    ("artifactory_token", r"AKCp[A-Za-z0-9]{69}|cmVmd[A-Za-z0-9]{59}"),
    ("discord_token", r"[MNO][\w-]{23,25}\.[\w-]{6}\.[\w-]{27,38}"),
    ("telegram_token", r"(?:bot)?\d{8,10}:AA[\w-]{33}" + _END),
    ("atlassian_token", r"AT[AC]TT3[\w=-]{150,}|ATBB[A-Za-z0-9]{28,}"),
    ("linear_key", r"lin_(?:api|oauth)_[A-Za-z0-9]{40}"),
    ("notion_token", r"ntn_[A-Za-z0-9]{40,}|secret_[A-Za-z0-9]{43}" + _END),
    ("huggingface_token", r"hf_[A-Za-z0-9]{30,}|api_org_[A-Za-z]{34}"),
    ("anthropic_key", r"sk-ant-[\w-]{20,}"),
    ("openai_key", r"sk-(?:proj-|svcacct-|admin-)?[\w-]{20,}"),
    ("groq_key", r"gsk_[A-Za-z0-9]{48,}"),
    ("xai_key", r"xai-[A-Za-z0-9]{60,}"),
    ("perplexity_key", r"pplx-[A-Za-z0-9]{40,}"),
    ("replicate_token", r"r8_[A-Za-z0-9]{37}"),
    ("langsmith_key", r"lsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}"),
    ("grafana_token", r"glc_[A-Za-z0-9+/]{32,}={0,2}|glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}"),
    ("grafana_token", r"eyJrIjoi[A-Za-z0-9]{60,}"),
    ("newrelic_key", r"NR(?:AK|II|JS|AA)-[\w-]{19,32}"),
    ("sentry_token", r"sntrys_eyJ[A-Za-z0-9+/=_]{50,}|sntryu_[a-f0-9]{64}"),
    ("dropbox_token", r"sl\.(?:u\.)?[\w=-]{130,}"),
    ("postman_key", r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}"),
    ("pulumi_token", r"pul-[a-f0-9]{40}"),
    ("age_secret_key", r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}"),
    ("onepassword_token", r"ops_eyJ[A-Za-z0-9+/]{100,}={0,3}|A3-[A-Z0-9]{6}-[A-Z0-9-]{23,29}"),
    ("alibaba_key", r"LTAI[A-Za-z0-9]{20}" + _END),
    ("cloudflare_key", r"v1\.0-[a-f0-9]{24}-[a-f0-9]{146}"),
    ("dynatrace_token", r"dt0c01\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{64}"),
    ("openshift_token", r"sha256~[\w-]{43}"),
    ("flyio_token", r"fo1_[\w-]{43}|fm[12][ar]?_[A-Za-z0-9+/]{100,}={0,3}"),
    ("easypost_key", r"EZ[AT]K[A-Za-z0-9]{54}"),
    ("facebook_token", r"EAA[MC][A-Za-z0-9]{100,}"),
    ("square_token", r"sq0(?:atp|csp)-[\w-]{22,}|EAAA[\w-]{60}"),
    ("mapbox_token", r"sk\.eyJ[\w.-]{20,}"),
    ("planetscale_token", r"pscale_(?:tkn|oauth|pw)_[\w=.-]{32,64}"),
    ("frameio_token", r"fio-u-[\w=-]{64}"),
    ("flutterwave_key", r"FLW(?:SECK|PUBK)_TEST-[a-hA-H0-9]{12,32}(?:-X)?"),
    ("duffel_token", r"duffel_(?:test|live)_[\w=-]{43}"),
    ("infracost_token", r"ico-[A-Za-z0-9]{32}"),
    ("octopus_key", r"API-[A-Z0-9]{26}" + _END),
    ("prefect_token", r"pnu_[A-Za-z0-9]{36}"),
    ("readme_token", r"rdme_[a-z0-9]{70}"),
    ("scalingo_token", r"tk-us-[\w-]{48}"),
    ("settlemint_token", r"sm_(?:aat|pat|sat)_[A-Za-z0-9]{16}"),
    ("shippo_token", r"shippo_(?:live|test)_[a-fA-F0-9]{40}"),
    ("typeform_token", r"tfp_[\w.=-]{59}"),
    ("clojars_token", r"CLOJARS_[A-Za-z0-9]{60}"),
    ("maxmind_key", r"[A-Za-z0-9]{6}_[A-Za-z0-9]{29}_mmk"),
    ("adobe_secret", r"p8e-[A-Za-z0-9]{32}"),
    ("harness_token", r"(?:pat|sat)\.[\w-]{22}\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{20}"),
    ("airtable_token", r"pat[A-Za-z0-9]{14}\.[a-f0-9]{64}"),
    ("intra42_secret", r"s-s4t2(?:ud|af)-[a-f0-9]{64}"),
    ("sourcegraph_token", r"sgp_[a-fA-F0-9_]{40,}"),
    ("private_key", r"LS0tLS1CRUdJTi[A-Za-z0-9+/=]{40,}"),  # base64 of "-----BEGIN "
    ("jwt", r"eyJ[\w-]{8,}\.eyJ[\w-]{8,}\.[\w-]*"),
)
_TOKEN = re.compile(
    r"(?<![A-Za-z0-9])(?:" + "|".join(f"(?P<t{i}>{pattern})" for i, (_, pattern) in enumerate(_TOKENS)) + ")"
)
# Runs of the characters tokens are made of; tokens and high-entropy strings are looked for inside.
_RUN = re.compile(r"[A-Za-z0-9_\-.=+/~:%]{16,}")
_CANDIDATE = re.compile(r"[A-Za-z0-9+/_\-]{24,}={0,2}")

# -- blocks --------------------------------------------------------------------------------------
# A private key runs from its BEGIN line to the next END line, or to the end of the text.
_PRIVATE_KEY_BEGIN = re.compile(
    r"-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----|---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----"
)
_PRIVATE_KEY_END = re.compile(
    r"-{4,5} ?END[ A-Z0-9_-]{0,100}(?:PRIVATE KEY(?: BLOCK)?|SSH2 ENCRYPTED PRIVATE KEY) ?-{4,5}"
)
_PUTTY_PRIVATE = re.compile(
    r"Private-Lines:[ \t]*\d+[ \t]*\r?\n((?:[A-Za-z0-9+/=]{1,128}[ \t]*(?:\r?\n|\Z)){1,400})"
    r"|Private-(?:MAC|Hash):[ \t]*([0-9a-fA-F]{16,})"
)
_K8S_DATA = re.compile(r"(?m)^([ \t]*)(?:data|stringData):[ \t]*\r?\n((?:\1[ \t]+[^\n]*(?:\n|\Z))+)")
_YAML_KEY = re.compile(r"[ \t]*[\w.\-]+:[ \t]*")

# -- credentials in place ------------------------------------------------------------------------
# scheme://userinfo@host: the last "@" before the path, so "p@ss@host" is one password.
_URL_USERINFO = re.compile(r"://([^\s/'\"<>\\`]{1,256})@")
_CLI_USER = re.compile(r"-(?:u|-user|-proxy-user)(?:[ \t]+|=)")
# Tools whose `-p` takes the password (elsewhere `-p` is a port or --parents); found lower-cased,
# then `-p` looked for, case-sensitively, on the rest of the line.
_CLI_PASSWORD_TOOL = re.compile(r"(?:mysql\w*|mariadb\w*|mycli|sshpass|login)\b")
_REGISTRY_LOGIN = re.compile(
    r"(?:docker|podman|nerdctl|buildah|skopeo|oras|helm|az|cf|oc)(?:[ \t]+(?:registry|acr))?[ \t]+$"
)
_CLI_PASSWORD_FLAG = re.compile(r"[ \t]-p(?:[ \t]+)?(?=[^\s-])")
# host:port:database:user:password; found from its port, then the host checked to the line start
_PGPASS = re.compile(r":(?:\d{1,5}|\*):[^\s:]{1,255}:[^\s:]{1,255}:(?=\S)")
_PGPASS_HOST = re.compile(r"[^\s:#'\"]{1,255}")

# -- assignments ---------------------------------------------------------------------------------
# A secret-sounding word, the rest of its identifier, closing quotes or brackets, a separator. Run
# on the lower-cased text; the name, its syntax and the value are then read (and judged) in Python.
_ASSIGN_SEP = (
    r"(?:[ \t]*(?::=|=>|\?=|==|!=|=|:(?![:/]))[ \t]*|>|[ \t]+value[ \t]*=[ \t]*|[ \t]+"
    r"|(?<=[\"'])[ \t]*,[ \t]*(?=[rbuf]?[\"']))"
)
# `os.Setenv("DB_PASSWORD", "x")`, `System.setProperty("db.password", "x")`: the name, then the value
_SETTER_CALL = re.compile(r"(?i)(?:set\w*|put\w*|getenv|get|fetch|env|define|add)\([ \t]*[\"']$")
# `<entry key="password">x</entry>`, `<parameter name="password">x</parameter>`
_MARKUP_KEY = re.compile(r"(?i)(?:key|name|id)[ \t]*=[ \t]*[\"']$")
# `- name: DB_PASSWORD` then `value: x` (Kubernetes env), `{"name": "DB_PASSWORD", "value": "x"}`
_NAME_VALUE = re.compile(
    r"name[\"']?[ \t]*[:=][ \t]*[\"']?([a-z0-9_.\-]{2,80})[\"']?[ \t]*(?:,[ \t]*|\r?\n[ \t]*(?:-[ \t]+)?)"
    r"[\"']?value[\"']?[ \t]*[:=][ \t]*"
)
_ASSIGN = re.compile(
    r"(?:pass|pwd|secret|token|key|auth|cred|salt|cookie|session|dsn|hmac|bearer|basic|jwt|sig)"
    rf"[\w.\-]{{0,60}}[\"'\]]{{0,2}}{_ASSIGN_SEP}"
)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_NAME_CHARS = re.compile(r"[\w.\-$@]{1,80}$")
_NAME_SPLIT = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")

_STRONG_ROOTS = tuple(
    "password passwd passphrase secret token apikey credential privatekey accesskey secretkey authkey "
    "masterkey clientsecret".split()
)
_STRONG_WORDS = {"pass", "pwd", "pw", "creds", "bearer", "jwt"}
_NOT_SECRET_WORDS = frozenset(
    "tokenize tokenizer tokenized tokenizing tokenization detokenize untokenize secretary "
    "passwordless tokenstream tokenizers".split()
)
_KEY_QUALIFIERS = frozenset(
    "api access secret private auth account master signing sign encryption encrypt enc crypt crypto "
    "client license licence session shared storage service consumer deploy ssh gpg pgp hmac jwt "
    "subscription admin root cipher aes rsa tls ssl app application webhook host server user".split()
)
_WEAK_WORDS = frozenset(
    "key sig signature salt hmac cookie cookies session sessionid sid dsn auth license licence "
    "private passwords secrets tokens credentials keys basic authorization".split()
)
# A last word that makes a strong name describe the secret instead of holding it.
_META_WORDS = frozenset(
    "length len min max count size type types kind field fields name names prompt label hint help "
    "regex re pattern policy file path dir url uri endpoint env var required reset expiry expires "
    "expiration ttl timeout format fmt encoding class cls manager provider factory handler validator "
    "generator mode enabled flag char chars index idx pos start end line lines col column table info "
    "error errors msg message text template placeholder list dict set map callback func fn method "
    "version scheme prefix suffix sep separator num number width bits algorithm algo option options "
    "opts params kwargs args arg param spec schema attr attribute stdin cmd command input iter "
    "iterator id ids usage doc store cache source src location loc ref refs ok is has valid check "
    "changed sent saved get getter setter limit limits budget window ratio rate cb".split()
)
_HEADER_NAMES = {"authorization", "proxy-authorization", "cookie", "set-cookie"}
_AUTH_SCHEME = re.compile(
    r"(?i)(?:bearer|basic|token|apikey|api-key|digest|negotiate|ntlm|splunk|ssws|sso-key|key|"
    r"aws4-hmac-sha256|otp|jwt)[ \t]+"
)
_SESSION_COOKIE = re.compile(r"(?i).*(?:sess|sid|token|auth|jwt|csrf|xsrf|remember|login|secret|key)")
_TYPE_WORDS = frozenset(
    "str string int integer bool boolean bytes bytearray float number any object none optional union "
    "list dict tuple char void secretstr secretbytes unknown never text uuid".split()
)
_CODE_CHAIN = re.compile(
    r"(?:new\s+|await\s+|not\s+|typeof\s+|yield\s+|-|!|\*{1,2})?[A-Za-z_$][\w$]*"
    r"(?:\s*(?:\.|\?\.|->|::)\s*[A-Za-z_$][\w$]*|\[[^\]]*\]|\((?:[^()]|\([^()]*\))*\)?"
    r"|\s*\|\s*[A-Za-z_][\w.\[\]]*)*"
    r"[;,]?\)?"
)
_TEMPLATE = re.compile(r"\$\{\w+|\$\(|\{\{|\{%|<%|%\(?\w*\)?[sdr]|\{[^{}\s]*\}|#\{")
_PLACEHOLDER_WORDS = frozenset(
    "none null nil true false undefined yes no on off changeme xxx password secret token ... ~ "
    "redacted required optional default example placeholder string".split()
)
_STOPWORDS = frozenset(
    "the a an to of for is be if or and in with when this that your you not will should must use used "
    "from by as on it are can enter please new user's which".split()
)
_FULL_LINE_PREFIX = re.compile(
    r"[ \t]*(?:-[ \t]+)?(?:(?:export|set|setx|setenv|env|ENV|ARG|declare(?:[ \t]+-\w+)?|local|readonly)"
    r"[ \t]+|\$env:)?[\"']?"
)
_COMMENT_PREFIX = re.compile(r"[ \t]*(?:#|//|/\*|\*|--|;|<!--|rem\b|REM\b)")
_NETRC_LINE = re.compile(r"(?m)^[ \t]*(?:machine|default)[ \t]")
_NETRC_PREFIX = re.compile(
    r"[ \t]*(?:(?:machine[ \t]+\S+|default)(?:[ \t]+(?:login|account)[ \t]+\S+)*)?[ \t]*"
)
_REFERENCE = re.compile(
    r"\$\{?[\w:.\-]*\}?|\$\(.*|\$\{\{.*|\{\{.*\}\}|<[\w\- .]*>|%\(?\w*\)?[sdr]|\*+|[xX.]{3,}"
)
_REFERENCE_START = re.compile(r"!(?:Ref|Sub|GetAtt|ImportValue|vault|env)\b|\*\w|secretKeyRef|valueFrom")
_FALLBACK_LITERAL = re.compile(r"(?:,|\bor\b|\|\||\?\?|\?:)\s*[rbu]?([\"'])((?:[^\"'\\]|\\.){3,200})\1")
_OPENER = {")": "(", "]": "[", "}": "{"}
_MORE_LITERALS = re.compile(r"(?:[ \t]*,[ \t]*[rbu]?([\"'])(?:[^\"'\\\n]|\\.)*\1)+")
_TEMPLATING = ("code", "string", "comment")  # syntaxes where `{x}`, `%s` in a string are templates
_STRING_BODY = {q: re.compile(rf"(?:[^{q}\\\n]|\\.)*") for q in "\"'`"}
_GLUED = re.compile(r"(?:\"[^\"\n]*\"|'[^'\n]*'|[\w$@#%^&*!+=.-])*")
_SURROGATE = re.compile("[\ud800-\udfff]")
_MARKER = re.compile(r"\[REDACTED:[\w.-]+\]")
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")


@dataclass(frozen=True)
class Redaction:
    """The redacted text and what was taken out (kinds only, never values)."""

    text: str
    kinds: tuple[str, ...]


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    kind: str
    rank: int  # which detector found it: on overlap the lower rank names the kind


def shannon_entropy(value: str) -> float:
    if not value:
        return 0.0
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())


def redact(text: str | bytes | None) -> Redaction:
    """`text` with every secret-looking substring replaced by `[REDACTED:kind]`.

    Never raises on odd input: bytes are decoded (invalid UTF-8 kept as surrogates), NULs and lone
    surrogates are ordinary characters, and the lone surrogates come back as U+FFFD, so that the text
    can be stored (SQLite refuses them). Time is bounded: the text is scanned in chunks, and what a
    time budget (`_BUDGET_S` plus `_BUDGET_S_PER_MB`) leaves unscanned is replaced whole, as is a
    text over `MAX_SCANNED_CHARS`.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    if not text:
        return Redaction(text or "", ())
    if len(text) > MAX_SCANNED_CHARS:
        return Redaction("[REDACTED:oversized]", ("oversized",))
    deadline = time.monotonic() + _BUDGET_S + _BUDGET_S_PER_MB * len(text) / 1e6
    scan = _Scan.of(text)
    blocks = _blocks(text)
    spans = list(blocks)
    for start in range(0, len(text), _CHUNK):
        if time.monotonic() > deadline:
            spans.append(_Span(start, len(text), "unscanned", 0))
            break
        end = min(len(text), start + _CHUNK)
        if any(block.start <= start and end <= block.end for block in blocks):
            continue  # inside a private key already redacted whole
        spans += _tokens(scan, start, end) + _in_place(scan, start, end) + _assignments(scan, start, end)
    result = _apply(text, spans)
    if not result.text.isascii() and _SURROGATE.search(result.text):
        result = Redaction(_SURROGATE.sub("\ufffd", result.text), result.kinds)
    return result


@dataclass(frozen=True)
class _Scan:
    """The text, read once for what every chunk needs."""

    text: str
    lowered: str  # lower-cased, same length and positions
    netrc: bool  # the text holds a .netrc `machine` line

    @classmethod
    def of(cls, text: str) -> _Scan:
        lowered = text.lower()
        if len(lowered) != len(text):  # "İ" lowers to two characters; keep positions
            lowered = text.translate(_ASCII_LOWER)
        netrc = ("machine" in lowered or "default" in lowered) and bool(_NETRC_LINE.search(text))
        return cls(text, lowered, netrc)


def _matches(pattern: re.Pattern[str], string: str, start: int, end: int) -> Iterator[re.Match[str]]:
    """Matches that start in [start, end); they may run `_OVERLAP` characters past `end`."""
    for match in pattern.finditer(string, start, min(len(string), end + _OVERLAP)):
        if match.start() >= end:
            return
        yield match


def _apply(text: str, spans: list[_Span]) -> Redaction:
    merged: list[_Span] = []
    for span in sorted(spans, key=lambda s: (s.start, s.rank)):
        if span.end <= span.start:
            continue
        if merged and span.start < merged[-1].end:
            last = merged[-1]
            kind = last.kind if last.rank <= span.rank else span.kind
            merged[-1] = _Span(last.start, max(last.end, span.end), kind, min(last.rank, span.rank))
        else:
            merged.append(span)
    pieces, position = [], 0
    for span in merged:
        pieces += [text[position : span.start], f"[REDACTED:{span.kind}]"]
        position = span.end
    pieces.append(text[position:])
    return Redaction("".join(pieces), tuple(span.kind for span in merged))


# -- detectors -----------------------------------------------------------------------------------


def _blocks(text: str) -> list[_Span]:
    spans = []
    position = 0 if "PRIVATE KEY" in text else len(text)
    while begin := _PRIVATE_KEY_BEGIN.search(text, position):
        end = _PRIVATE_KEY_END.search(text, begin.end())
        position = end.end() if end else len(text)
        spans.append(_Span(begin.start(), position, "private_key", 0))
    if "Private-" in text:
        for match in _PUTTY_PRIVATE.finditer(text):
            group = 1 if match.group(1) is not None else 2
            spans.append(_Span(match.start(group), match.end(group), "private_key", 0))
    if "kind: Secret" in text or 'kind: "Secret"' in text:
        spans += _kubernetes_secret_values(text)
    return spans


def _kubernetes_secret_values(text: str) -> list[_Span]:
    """Every value under `data:` / `stringData:` (base64 of short secrets is not high-entropy)."""
    spans = []
    for block in _K8S_DATA.finditer(text):
        for line in re.finditer(r"[^\n]+", block.group(2)):
            content = line.group()
            key = _YAML_KEY.match(content)
            start = key.end() if key else len(content) - len(content.lstrip())
            value = content[start:].rstrip()
            if value and value not in ("|", ">", "|-", ">-", "|+", ">+") and not _MARKER.fullmatch(value):
                first = block.start(2) + line.start() + start
                spans.append(_Span(first, first + len(value), "kubernetes_secret", 1))
    return spans


def _tokens(scan: _Scan, start: int, end: int) -> list[_Span]:
    """Provider tokens and high-entropy strings, looked for inside runs of token characters."""
    text, spans = scan.text, []
    for run in _matches(_RUN, text, start, end):
        for match in _TOKEN.finditer(text, run.start(), run.end()):
            kind = _TOKENS[int(match.lastgroup[1:])][0]
            spans.append(_Span(match.start(), match.end(), kind, 1))
        if run.end() - run.start() >= 24:
            spans += [
                _Span(m.start(), m.end(), "high_entropy", 4)
                for m in _CANDIDATE.finditer(text, run.start(), run.end())
                if _looks_random(m.group())
            ]
    return spans


def _looks_random(token: str, min_length: int = 24) -> bool:
    """A token whose characters look drawn at random (keys), not written (identifiers, paths)."""
    if len(token) < min_length:
        return False
    classes = sum(bool(re.search(p, token)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]"))
    if classes < 2:
        return False
    if re.fullmatch(r"[0-9a-f]+|[0-9A-F]+", token) and len(token) >= (32 if min_length >= 24 else 16):
        # hex: the 16-symbol alphabet caps entropy at 4 bits; sha digests are redacted too (cheap).
        return shannon_entropy(token) > 3.0
    if re.fullmatch(r"[A-Za-z]+(?:_[A-Za-z0-9]+)*", token):
        return False  # words and snake_case: identifiers
    # Written text turns lower to upper case, or letters to digits, only where a word starts (once
    # in 5-8 characters); random text does so at almost every other character.
    pairs = changes = 0
    for a, b in zip(token, token[1:], strict=False):
        if a.isalnum() and b.isalnum():
            pairs += 1
            changes += a.isdigit() != b.isdigit() or a.islower() and b.isupper()
    if not pairs or changes / pairs < 0.3:
        return False
    digits = sum(c.isdigit() for c in token)
    threshold = 4.0 if len(token) >= 24 else math.log2(len(token)) - 0.6
    return shannon_entropy(token) > threshold and (digits >= 2 or classes == 3 and len(token) >= 32)


def _in_place(scan: _Scan, start: int, end: int) -> list[_Span]:
    """URL userinfo, `curl -u user:pass`, `mysql -pSECRET`, `.pgpass` lines."""
    text, spans = scan.text, []
    for match in _matches(_URL_USERINFO, text, start, end):
        spans += _url_userinfo(match)
    for match in _matches(_CLI_USER, text, start, end):
        if match.start() > 0 and not text[match.start() - 1].isspace():
            continue
        value_start, value_end = _value_bounds(text, match.end())
        colon = text.find(":", value_start, value_end)
        value = text[colon + 1 : value_end]
        if colon >= 0 and "://" not in text[value_start:value_end] and not _is_reference(value):
            spans.append(_Span(colon + 1, value_end, "cli_password", 2))
    for tool in _matches(_CLI_PASSWORD_TOOL, scan.lowered, start, end):
        before = scan.lowered[max(0, tool.start() - 40) : tool.start()]
        if tool.group() == "login" and not _REGISTRY_LOGIN.search(before):
            continue
        flag = _CLI_PASSWORD_FLAG.search(text, tool.end(), _line_end(text, tool.end()))
        if flag:
            value_start, value_end = _value_bounds(text, flag.end())
            if not _is_reference(text[value_start:value_end]):
                spans.append(_Span(value_start, value_end, "cli_password", 2))
    for match in _matches(_NAME_VALUE, scan.lowered, start, end):
        span = _named_value(text, match)
        if span is not None:
            spans.append(span)
    for match in _matches(_PGPASS, text, start, end):
        newline = text.rfind("\n", max(0, match.start() - 256), match.start())
        line_start = newline + 1 if newline >= 0 or match.start() <= 256 else -1
        if line_start >= 0 and _PGPASS_HOST.fullmatch(text, line_start, match.start()):
            spans.append(_Span(match.end(), _line_end(text, match.end()), "pgpass_password", 2))
    return spans


def _named_value(text: str, match: re.Match[str]) -> _Span | None:
    """The value of a `name: X` / `value: y` pair whose X is a secret's name."""
    name = text[match.start(1) : match.end(1)]
    strength = _name_strength(name)
    if strength == 0:
        return None
    site = _Site(name, strength, ":", "config", "", "")
    if _opening_quote(text, match.end()):
        return _quoted_value(text, site, match.end())
    value_start, value_end = match.end(), _line_end(text, match.end())
    value = text[value_start:value_end].rstrip().rstrip(",}")
    return _literal(site, value_start, value)


def _url_userinfo(match: re.Match[str]) -> list[_Span]:
    """The password of `scheme://user:password@host`; a user alone when it is token-shaped."""
    start, end = match.start(1), match.end(1)
    # markers of an earlier redaction hold a ":"; blanked, they are neither user nor password
    userinfo = _MARKER.sub(lambda m: " " * len(m.group()), match.group(1))
    user, colon, password = userinfo.partition(":")
    if colon:
        if password.strip() and not _is_reference(password):
            return [_Span(start + len(user) + 1, end, "url_password", 2)]
        return []
    mixed = bool(re.search(r"\d", user) and re.search(r"[A-Za-z]", user))
    token_like = len(user) >= 20 or len(user) >= 12 and mixed
    if token_like and " " not in user and not _is_reference(user):
        return [_Span(start, end, "url_token", 2)]
    return []


def _assignments(scan: _Scan, start: int, end: int) -> list[_Span]:
    spans: list[_Span] = []
    read_until = 0
    for match in _matches(_ASSIGN, scan.lowered, start, end):
        if match.start() < read_until:
            continue  # a name inside a value already read: `password=password=...`, `Cookie: a=b; c=d`
        site = _site(scan.text, match)
        span = _assignment(scan.text, site, match.end(), scan.netrc) if site is not None else None
        if span is not None:
            spans.append(span)
            read_until = span.end
        if site is not None and site.name.lower() in _HEADER_NAMES:
            read_until = max(read_until, _header_bounds(scan.text, site, match.end())[1])
    return spans


@dataclass(frozen=True)
class _Site:
    """Where a name meets its value: enough to read the value the way its syntax would."""

    name: str
    strength: int  # 2 strong (password, token...), 1 weak (*_key, salt...): only a random value
    sep: str  # the separator, stripped ("=", ":", ">", "value=", "" for whitespace)
    syntax: str  # flag | markup | words | query | string | comment | config | code
    line_prefix: str  # what precedes the name on its line
    in_string: str  # the quote of a string literal the name is written inside, or ""


def _site(text: str, match: re.Match[str]) -> _Site | None:
    start = match.start()
    left = _NAME_CHARS.search(text, max(0, start - 80), start)
    name_start = left.start() if left else start
    name_end = start + re.match(r"[\w.\-]*", text[start : start + 80]).end()
    name = text[name_start:name_end]
    strength = _name_strength(name)
    if strength == 0 or text.endswith("[REDACTED:", 0, name_start):
        return None
    raw_sep = text[name_end : match.end()]
    sep = raw_sep.lstrip("\"']").strip()
    if sep in ("==", "!="):
        strength = 1  # a comparison: only a value that looks generated
    # At most _PREFIX characters: on a longer line the name is mid-line anyway.
    newline = text.rfind("\n", max(0, name_start - _PREFIX), name_start)
    line_prefix = text[newline + 1 if newline >= 0 else max(0, name_start - _PREFIX) : name_start]
    if newline < 0 and name_start > _PREFIX:
        line_prefix = "\x00" + line_prefix[1:]  # not the start of a line
    in_string = _open_quote(line_prefix)
    quoted_key = bool(in_string) and raw_sep.startswith(in_string)  # "password": ..., key="ApiKey" value=
    syntax = _syntax(
        name,
        sep,
        raw_sep != raw_sep.strip(),
        text[name_start - 1 : name_start],
        line_prefix,
        bool(in_string) and not quoted_key,
    )
    if syntax is None:
        return None
    return _Site(name, strength, sep, syntax, line_prefix, "" if quoted_key else in_string)


def _syntax(name: str, sep: str, spaced: bool, before: str, prefix: str, in_string: bool) -> str | None:
    """How the value after this name is written, which decides where it ends and what is code."""
    if name.startswith("-"):
        return "flag"
    if sep == ",":
        return "code" if _SETTER_CALL.search(prefix) else None
    if sep == ">" and before in ('"', "'") and _MARKUP_KEY.search(prefix):
        return "markup"
    if sep in (">", "value="):
        return "markup" if (before == "<") == (sep == ">") else None
    if sep == "":
        return "words"
    if in_string:
        # "X-Api-Key: abc" or "token=%s" inside a string literal; not f"{token:02x}"
        return None if before == "{" else "string"
    if before in ("?", "&", ";") or before in (":", "/", "=") and sep == "=" and not spaced:
        return "query"
    comment = _COMMENT_PREFIX.match(prefix)
    if comment and (spaced or sep != "="):
        return "comment"
    prefix = prefix[comment.end() :] if comment else prefix
    full_line = bool(_FULL_LINE_PREFIX.fullmatch(prefix))
    if sep == "=" and not spaced and (full_line or re.fullmatch(r"[A-Z][A-Z0-9_.]*", name)):
        return "config"  # .env, shell, .properties, `docker run -e NAME=x`
    if sep in (":", "?=") and full_line and before != ".":
        return "config"  # YAML, HTTP headers, Makefile
    return "code"


def _name_strength(name: str) -> int:
    """2 for names that hold a secret whatever its shape, 1 for names whose value must look random."""
    words = _NAME_SPLIT.findall(name.lstrip("-$@"))
    lowered = [w.lower() for w in words]
    if not lowered or lowered[-1] in _NOT_SECRET_WORDS:
        return 0
    strong = weak = False
    for i, word in enumerate(lowered):
        if word in _NOT_SECRET_WORDS or word == "pass" and i < len(lowered) - 1:
            continue  # `pass_stmt`, `pass_through`: "pass" is a secret's name only at the end
        if word in _STRONG_WORDS or any(root in word for root in _STRONG_ROOTS):
            if word in ("passwords", "secrets", "tokens", "credentials"):
                weak = True
            else:
                strong = True
        elif word == "key" and i > 0 and lowered[i - 1] in _KEY_QUALIFIERS:
            strong = True
        elif word in _WEAK_WORDS and (word != "key" or i > 0):
            weak = True
    if strong and lowered[-1] in _META_WORDS:
        return 1
    return 2 if strong else 1 if weak else 0


def _assignment(text: str, site: _Site, start: int, netrc: bool) -> _Span | None:
    lowered = site.name.lower()
    if site.sep == "" and lowered in ("bearer", "basic", "token"):
        return _scheme_token(text, site, start)
    if site.syntax == "words" and not _whitespace_value(text, site, start, netrc):
        return None
    quote = _opening_quote(text, start)
    if quote and quote[0] == site.in_string:
        return None  # `print("token=" + t)`: the quote ends the string the name is written in
    header_syntax = site.sep == ":" or site.syntax in ("config", "string", "markup")
    if lowered in _HEADER_NAMES and (quote or header_syntax):
        return _header_value(text, site, start)
    if quote:
        return _quoted_value(text, site, start)
    return _bare_value(text, site, start)


def _whitespace_value(text: str, site: _Site, start: int, netrc: bool) -> bool:
    """`.netrc` (`machine h login u password p`), `requirepass x` alone on its line."""
    lowered = site.name.lower()
    if lowered in ("password", "passwd", "account") and _NETRC_PREFIX.fullmatch(site.line_prefix):
        if site.line_prefix.strip() or netrc:
            return True
    quote = _opening_quote(text, start)
    if site.strength == 2 and quote and quote[0] in ("'", '"') and lowered not in ("pass", "pw"):
        return True  # `WITH PASSWORD 'x'` (SQL), `proxy_set_header X-Api-Key "x"` (nginx)
    words = text[start : _line_end(text, start)].split()
    if site.strength < 2 or site.line_prefix.strip() or len(words) != 1:
        return False
    plain = lowered in ("password", "passwd", "passphrase", "token", "secret", "credentials", "pass")
    sentence_end = words[0].endswith((".", ",", ":", ";"))
    return not plain or bool(re.search(r"[^A-Za-z]", words[0])) and not sentence_end


def _header_value(text: str, site: _Site, start: int) -> _Span | None:
    """`Authorization: Bearer x` (the scheme stays readable), the session values of `Cookie: a=b`."""
    start, end = _header_bounds(text, site, start)
    if "cookie" in site.name.lower():
        return _cookie_values(text, start, end)
    scheme = _AUTH_SCHEME.match(text, start, end)
    start = scheme.end() if scheme else start
    value = text[start:end].rstrip()
    if len(value) < 3 or _is_reference(value) or _TEMPLATE.search(value) or _MARKER.fullmatch(value):
        return None
    if not scheme and re.fullmatch(r"[A-Za-z_][\w.]*,?|[a-z]+(?: [a-z]+)+", value):
        return None  # a variable, or words
    return _Span(start, start + len(value), "auth_header", 2)


def _header_bounds(text: str, site: _Site, start: int) -> tuple[int, int]:
    """The header's value: inside its quotes, or up to the end of the string or line it is in."""
    end = _line_end(text, start)
    quote = _opening_quote(text, start)
    if quote:
        start = quote[1] + len(quote[0])
        closing = text.find(quote[0], start, end)
        return start, closing if closing >= 0 else end
    if site.in_string:
        closing = text.find(site.in_string, start, end)
        return start, closing if closing >= 0 else end
    return start, end


def _cookie_values(text: str, start: int, end: int) -> _Span | None:
    spans = []
    for pair in re.finditer(r"([^=;\s]+)=([^;\s]*)", text[start:end]):
        if pair.group(2) and (_SESSION_COOKIE.match(pair.group(1)) or _secret_shaped(pair.group(2))):
            spans.append(_Span(start + pair.start(2), start + pair.end(2), "cookie", 2))
    # One span per assignment: the first session value to the last (the names between are lost).
    return _Span(spans[0].start, spans[-1].end, "cookie", 2) if spans else None


def _scheme_token(text: str, site: _Site, start: int) -> _Span | None:
    """`Bearer x`, `token x` outside a header: only a token-shaped word (prose says "token is")."""
    _, end = _value_bounds(text, start, stops=",;)]}>\"'`<")
    value = text[start:end]
    if len(value) < 16 or not re.fullmatch(r"[A-Za-z0-9_\-.=+/~]+", value) or _MARKER.search(value):
        return None
    if site.name.lower() != "bearer" and not (re.search(r"\d", value) and re.search(r"[A-Za-z]", value)):
        return None
    return _Span(start, end, "auth_header", 2)


def _opening_quote(text: str, start: int) -> tuple[str, int] | None:
    """(quote, its position) when a string literal starts at `start`: "..", '''..''', r"..", f'..'."""
    prefix = re.match(r"[rbufRBUF]{0,2}(\"\"\"|'''|[\"'`]|\\[\"'])", text[start : start + 5])
    return (prefix.group(1), start + prefix.start(1)) if prefix else None


def _open_quote(line_prefix: str) -> str:
    """The quote of a string still open at the end of `line_prefix` ("" when none is)."""
    inside = ""
    i = 0
    while i < len(line_prefix):
        char = line_prefix[i]
        if char == "\\" and inside:
            i += 2
            continue
        if char in "\"'`" and (not inside or char == inside):
            inside = "" if inside else char
        i += 1
    return inside


def _quoted_value(text: str, site: _Site, start: int) -> _Span | None:
    quote, position = _opening_quote(text, start)
    value_start = position + len(quote)
    limit = min(len(text), value_start + _MAX_VALUE)
    if len(quote) > 1:  # '''..''', or \"..\" inside a JSON string (a notebook's source)
        end = text.find(quote, value_start, limit)
        end = limit if end < 0 else end
    else:  # up to the closing quote, or the end of the line when it is not closed there
        end = _STRING_BODY[quote].match(text, value_start, limit).end()
    # Interpolation is a template in code (f"..", `..${x}`), a character of the secret in .env/YAML.
    templating = "f" in text[start:position].lower() or quote == "`" or site.syntax in _TEMPLATING
    if not _worth_redacting(
        text[value_start : min(end, value_start + _JUDGED)], site, templating=templating, quoted=True
    ):
        return None
    if site.syntax in ("config", "query", "flag", "words") and text.startswith(quote, end):
        glued = _GLUED.match(text, end + len(quote), min(len(text), end + len(quote) + _MAX_VALUE))
        end = glued.end() if glued.end() > glued.start() else end  # shell glue: P='ab'"cd"ef
    elif site.syntax == "code" and "," in site.line_prefix and text.startswith(quote, end):
        # `user, password = "wile", "coyote"`: which literal is the secret is not known; all of them
        more = _MORE_LITERALS.match(text, end + len(quote), _line_end(text, end))
        end = more.end() - 1 if more and more.end() > more.start() else end
    return _Span(value_start, end, _assigned_kind(site), 3)


def _bare_value(text: str, site: _Site, start: int) -> _Span | None:
    line_end = _line_end(text, start)
    head_end = min(line_end, start + _JUDGED)  # what the judgement reads; a span may run to line_end
    syntax = site.syntax
    if syntax in ("flag", "query", "words", "string"):
        stops = {"query": "&;\"'`<", "string": site.in_string + ",;)"}.get(syntax, "\"'`")
        _, end = _value_bounds(text, start, stops=stops)
        value = text[start:end]
        if syntax == "string" and re.fullmatch(r"[A-Za-z]+[.,:;]?|[\[(<{].*", value):
            return None  # "pwd: expected bytes", "token = [CFWS]": a word or grammar in a message
        return _literal(site, start, value)
    if syntax == "markup":
        end = text.find("<", start, line_end)
        return _literal(site, start, text[start : end if end >= 0 else line_end])
    value = re.split(r"[ \t]+(?:#|//)", text[start:head_end], maxsplit=1)[0].rstrip()
    if syntax == "comment":
        return _literal(replace(site, strength=1), start, value)  # prose, grammar: only a random value
    if syntax == "config" and _is_code_in_config(value, site):
        syntax = "code"
    if syntax != "code" and head_end < line_end:
        value = text[start:line_end]  # a long literal: redacted to the end of its line
    if syntax == "code":
        annotated = re.match(r"([\w.\[\], |]+?)[ \t]*=[ \t]*", value) if site.sep == ":" else None
        if annotated and _is_type(annotated.group(1)):  # `password: str = "x"`: judge the default
            site = replace(site, sep="=")
            default = start + annotated.end()
            return _quoted_value(text, site, default) if _opening_quote(text, default) else None
        if site.sep == ":" or _is_code(value, site):
            return _code_value(text, site, start, value)
    if value.strip() in ("|", ">", "|-", ">-", "|+", ">+"):
        return _yaml_block(text, site, start + len(value))
    return _literal(site, start, value)


def _literal(site: _Site, start: int, value: str) -> _Span | None:
    value = value.rstrip()
    if site.syntax in ("config", "code", "comment"):
        value = value.rstrip(";,")
        for _ in range(8):  # the end of the code around it: `{"TOKEN": None}`
            if (
                not value
                or value[-1] not in _OPENER
                or value.count(value[-1]) <= value.count(_OPENER[value[-1]])
            ):
                break
            value = value[:-1].rstrip(";, ")
    templating = site.syntax in ("code", "comment")
    if not _worth_redacting(value[:_JUDGED], site, templating=templating, quoted=False):
        return None
    return _Span(start, start + len(value), _assigned_kind(site), 3)


def _assigned_kind(site: _Site) -> str:
    return "assigned_secret" if site.strength == 2 else "assigned_key"


def _is_code_in_config(value: str, site: _Site) -> bool:
    """A config-looking line whose value is still code: `password: str`, `key=self._key, x=y`."""
    stripped = value.strip()
    if stripped[:1] in ("(", "[", "{"):
        return True  # a tuple, list or object: its literals are judged as code (`_code_value`)
    if site.sep == ":" and (_is_type(stripped) or re.fullmatch(r"[A-Z][a-z]+[A-Z]?[A-Za-z]*", stripped)):
        return True  # a type or a class: `password: SecretStr`
    if re.fullmatch(r"[\w.\[\], |]+?\s*=\s*.+", stripped) and site.sep == ":":
        return True  # `password: str = "..."`, an annotated default
    if site.sep == "=" and not re.fullmatch(r"[A-Z][A-Z0-9_.]*", site.name):
        # a keyword argument on a continuation line: `authkey=self._authkey, exposed=exposed`
        if re.search(r"[,(]$|\)[:;]?$|,\s*\w+=", stripped):
            return True
    if stripped.endswith(",") and _CODE_CHAIN.fullmatch(stripped[:-1]):
        return True  # `password: userPassword,` in a JS object
    attribute = r"(?:self|this|cls|os|process|env|config|settings|args)\.[\w.\[\]'\"()]+"
    return bool(re.fullmatch(attribute, stripped) or re.fullmatch(r"[\w.]+\(.*", stripped))


def _is_code(value: str, site: _Site) -> bool:
    """An unquoted value in code: a name, call, attribute, type or expression, not a literal."""
    stripped = value.strip().rstrip(";,")
    if not stripped or _is_reference(stripped) or re.search(r"[()\[\]{}'\"`<>=\\]|,\s", stripped):
        return True
    if _CODE_CHAIN.fullmatch(stripped):
        # a name with digits in `password = hunter2` (INI) is more likely the password
        return not (site.sep == "=" and re.fullmatch(r"[A-Za-z]+\d+[A-Za-z\d]*", stripped))
    if re.search(r"\s(?:if|else|or|and|for|in|is|not)\s|\|\||&&|\?\?|\s[-+*/%|&^]\s|\blambda\b", stripped):
        return True
    if re.fullmatch(r"-?\d+(?:\.\d+)?|0x[0-9a-fA-F]+", stripped):
        return site.strength < 2 or len(stripped) < 6
    return len(stripped) < 3


def _is_type(value: str) -> bool:
    words = re.findall(r"[A-Za-z_]\w*", value)
    return (
        bool(words)
        and words[0].lower() in _TYPE_WORDS | {"optional", "union", "list", "dict", "sequence", "mapping"}
        and all(w.lower() in _TYPE_WORDS or w[0].isupper() for w in words)
        and bool(re.fullmatch(r"[\w.\[\], |]+\??", value))
    )


def _is_reference(value: str) -> bool:
    """A reference to a secret kept elsewhere: `$VAR`, `${{ secrets.X }}`, `<token>`, `%s`."""
    stripped = value.strip().strip("\"'")
    return bool(
        not stripped
        or _REFERENCE.fullmatch(stripped)
        or _REFERENCE_START.match(stripped)
        or stripped.lower() in ("none", "null", "nil", "true", "false", "undefined", "~", "...")
    )


def _worth_redacting(value: str, site: _Site, *, templating: bool, quoted: bool) -> bool:
    stripped = value.strip()
    lowered = stripped.lower()
    if lowered in _PLACEHOLDER_WORDS or _is_reference(stripped) or _MARKER.fullmatch(stripped):
        return False
    if templating and _TEMPLATE.search(stripped) and not _looks_random(_TEMPLATE.sub("", stripped), 16):
        return False  # an f-string or template: the secret is elsewhere
    if re.fullmatch(r"your[_\- ].*|<[^<>]*>|\{\{[^{}]*\}\}", lowered) or _ENV_NAME.fullmatch(stripped):
        return False  # a placeholder, or the name of an environment variable
    if _is_prose(stripped) or re.fullmatch(r"(?:/|~/|\./|\.\./|[A-Za-z]:\\)[\w./\\\-]*", stripped):
        return False  # a sentence about the secret, or a path to it
    if site.strength == 2:
        return len(stripped) >= 3 and not (quoted and len(stripped) < 4 and not stripped.isalnum())
    return _secret_shaped(stripped)


def _is_prose(value: str) -> bool:
    words = [w.strip(".,:;!?()'\"") for w in value.replace("\\n", " ").split()]
    return (
        len(words) >= 3
        and any(w.lower() in _STOPWORDS for w in words)
        and sum(w.isalpha() for w in words) >= len(words) - 1
    )


def _secret_shaped(value: str) -> bool:
    """For names that may hold anything (`sort_key`, `salt`): a value that looks generated."""
    if len(value) < 12 or re.search(r"\s", value):
        return False
    if re.fullmatch(r"[A-Za-z]+(?:[_\-.:/][A-Za-z]+)*|[\d.:\-T Z+]+|(?:[\w.\-]+/)+[\w.\-]*|\w+://\S*", value):
        return False
    return _looks_random(value, 12)


def _code_value(text: str, site: _Site, start: int, expression: str) -> _Span | None:
    """Code assigned to a strong name: only its fallback literals are secrets.

    `os.environ.get("PW", "hunter2")`, `x or "hunter2"`, `auth = ("user", "hunter2")`.
    """
    if site.strength < 2 and site.name.lower() != "auth":
        return None
    flat = re.sub(r"([\"'])(?:[^\"'\\]|\\.)*\1", lambda m: "_" * len(m.group()), expression)
    for literal in _FALLBACK_LITERAL.finditer(expression):
        depth = sum(flat[: literal.start()].count(c) for c in "([{") - sum(
            flat[: literal.start()].count(c) for c in ")]}"
        )
        opener = flat[: literal.start()].rstrip()
        in_getter = depth == 1 and re.search(r"(?:get|getenv|fetch|setdefault|env)\([^()]*$", opener)
        in_tuple = depth == 1 and expression.lstrip().startswith(("(", "["))
        if depth == 0 and not literal.group().startswith(",") or in_getter or in_tuple:
            if _worth_redacting(
                literal.group(2), _Site(site.name, 2, "=", "code", "", ""), templating=True, quoted=True
            ):
                return _Span(start + literal.start(2), start + literal.end(2), "assigned_secret", 3)
    return None


def _yaml_block(text: str, site: _Site, start: int) -> _Span | None:
    """`password: |` followed by more-indented lines: the lines are the value."""
    if site.strength < 2:
        return None
    indent = len(site.line_prefix) - len(site.line_prefix.lstrip())
    pattern = re.compile(rf"(?:\r?\n(?:[ \t]{{{indent + 1},}}[^\n]*|[ \t]*(?=\r?\n)))+")
    block = pattern.match(text, start, min(len(text), start + 16 * _MAX_VALUE))
    if not block or not block.group().strip():
        return None
    first = start + len(block.group()) - len(block.group().lstrip())
    return _Span(first, start + len(block.group().rstrip()), "assigned_secret", 3)


# -- small helpers -------------------------------------------------------------------------------


def _line_end(text: str, start: int) -> int:
    end = text.find("\n", start, start + _MAX_VALUE)
    if end < 0:
        end = min(len(text), start + _MAX_VALUE)
    return end - 1 if end > start and text[end - 1] == "\r" else end


def _value_bounds(text: str, start: int, stops: str = "") -> tuple[int, int]:
    """A command-line word at `start`: quoted (quotes excluded) or up to whitespace or a stop."""
    if start < len(text) and text[start] in "\"'":
        quote = text[start]
        end = text.find(quote, start + 1, _line_end(text, start + 1) + 1)
        return start + 1, end if end >= 0 else _line_end(text, start + 1)
    return start, _word(stops).match(text, start, min(len(text), start + _MAX_VALUE)).end()


@functools.cache
def _word(stops: str) -> re.Pattern[str]:
    return re.compile(rf"[^\s{re.escape(stops)}]*")


def text_hash(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def for_storage(text: str | None, mode: str) -> tuple[str | None, str | None]:
    """(text to write, its hash) under a storage mode: full | hashed | none. Redacts first, always."""
    if text is None or mode == "none":
        return None, None
    clean = redact(text).text
    digest = text_hash(clean)
    return (clean if mode == "full" else None), digest
