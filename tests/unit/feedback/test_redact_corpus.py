"""Redaction on a corpus of real-world credential formats, and secret-free code left alone.

The corpus (`tests/data/secrets_corpus_formats.json`) is generated here, seeded: fake secrets of
the real shapes (provider prefixes, lengths and alphabets; passwords with `#`, `$`, quotes and
spaces) placed in code, config files and logs the way people write them. Regenerate it with
`python -m tests.unit.feedback.test_redact_corpus`; a test checks the file matches this generator.
"""

from __future__ import annotations

import base64
import json
import random
import re
import string
import sys
from pathlib import Path

import pytest

from feedback.redact import redact

CORPUS_PATH = Path(__file__).parents[2] / "data" / "secrets_corpus_formats.json"
SEED = 2026
ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
URLSAFE = ALNUM + "-_"
BECH32 = "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"


class Fake:
    """Fake secrets of real shapes, from one seeded generator."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def chars(self, alphabet: str, n: int) -> str:
        return "".join(self.rng.choice(alphabet) for _ in range(n))

    def password(self) -> str:
        words = ["Tr0ub4dor", "Correct", "Horse", "Zebra", "Quartz", "Mango", "Falcon", "Cobalt"]
        symbols = "#$!&*%@^"
        return (
            self.rng.choice(words)
            + self.rng.choice(symbols)
            + self.chars(string.digits, 2)
            + self.chars(string.ascii_letters, 3)
            + self.rng.choice(symbols)
            + self.chars(ALNUM, 3)
        )

    def uuid(self) -> str:
        h = self.chars(HEX, 32)
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def jwt(self) -> str:
        header = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
        claims = json.dumps({"sub": self.chars(string.digits, 8), "name": "Jane Roe", "iat": 1716200000})
        payload = base64.urlsafe_b64encode(claims.encode()).decode().rstrip("=")
        return f"{header}.{payload}.{self.chars(URLSAFE, 43)}"

    def pem_body(self, lines: int = 6) -> str:
        return "\n".join(self.chars(B64, 64) for _ in range(lines))

    def aws_secret(self) -> str:
        return self.chars(B64, 40)

    def base64_of(self, text: str) -> str:
        return base64.b64encode(text.encode()).decode()


def provider_tokens(f: Fake) -> dict[str, str]:
    """One token per provider shape (the gitleaks list), keyed by kind."""
    return {
        "aws_access_key": "AKIA" + f.chars("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16),
        "aws_session_key": "ASIA" + f.chars("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16),
        "github_pat": "ghp_" + f.chars(ALNUM, 36),
        "github_oauth": "gho_" + f.chars(ALNUM, 36),
        "github_app": "ghs_" + f.chars(ALNUM, 36),
        "github_user_to_server": "ghu_" + f.chars(ALNUM, 36),
        "github_refresh": "ghr_" + f.chars(ALNUM, 76),
        "github_fine_grained": "github_pat_" + f.chars(ALNUM, 22) + "_" + f.chars(ALNUM, 59),
        "gitlab_pat": "glpat-" + f.chars(URLSAFE, 20),
        "gitlab_deploy": "gldt-" + f.chars(URLSAFE, 20),
        "gitlab_runner": "glrt-" + f.chars(URLSAFE, 20),
        "gitlab_pipeline_trigger": "glptt-" + f.chars(HEX, 40),
        "gitlab_ci_job": "glcbt-" + f.chars(ALNUM, 2) + "_" + f.chars(URLSAFE, 20),
        "slack_bot": f"xoxb-{f.chars(string.digits, 12)}-{f.chars(string.digits, 13)}-{f.chars(ALNUM, 24)}",
        "slack_user": f"xoxp-{f.chars(string.digits, 12)}-{f.chars(string.digits, 12)}-"
        f"{f.chars(string.digits, 13)}-{f.chars(HEX, 32)}",
        "slack_app": f"xapp-1-A{f.chars(string.ascii_uppercase + string.digits, 10)}-"
        f"{f.chars(string.digits, 13)}-{f.chars(HEX, 64)}",
        "stripe_live": "sk_live_" + f.chars(ALNUM, 99),
        "stripe_restricted": "rk_live_" + f.chars(ALNUM, 24),
        "stripe_webhook": "whsec_" + f.chars(ALNUM, 32),
        "shopify_access": "shpat_" + f.chars(HEX, 32),
        "shopify_shared_secret": "shpss_" + f.chars(HEX, 32),
        "shopify_custom": "shpca_" + f.chars(HEX, 32),
        "shopify_private_app": "shppa_" + f.chars(HEX, 32),
        "twilio_api_key": "SK" + f.chars(HEX, 32),
        "sendgrid": f"SG.{f.chars(URLSAFE, 22)}.{f.chars(URLSAFE, 43)}",
        "mailgun": "key-" + f.chars(HEX, 32),
        "mailchimp": f.chars(HEX, 32) + "-us14",
        "heroku_v2": "HRKU-AA" + f.chars(URLSAFE, 58),
        "digitalocean_pat": "dop_v1_" + f.chars(HEX, 64),
        "digitalocean_oauth": "doo_v1_" + f.chars(HEX, 64),
        "doppler_personal": "dp.pt." + f.chars(ALNUM, 43),
        "doppler_service": "dp.st.prd." + f.chars(ALNUM, 40),
        "databricks": "dapi" + f.chars(HEX, 32),
        "vault_service": "hvs." + f.chars(URLSAFE, 95),
        "vault_batch": "hvb." + f.chars(URLSAFE, 140),
        "terraform_cloud": f.chars(ALNUM, 14) + ".atlasv1." + f.chars(URLSAFE, 67),
        "npm": "npm_" + f.chars(ALNUM, 36),
        "pypi": "pypi-AgEIcHlwaS5vcmc" + f.chars(URLSAFE, 70),
        "rubygems": "rubygems_" + f.chars(HEX, 48),
        "nuget": "oy2" + f.chars(string.ascii_lowercase + string.digits, 43),
        "docker_hub": "dckr_pat_" + f.chars(URLSAFE, 27),
        "discord_bot": "M" + f.chars(ALNUM, 25) + "." + f.chars(URLSAFE, 6) + "." + f.chars(URLSAFE, 38),
        "telegram_bot": f.chars(string.digits, 10) + ":AA" + f.chars(URLSAFE, 33),
        "atlassian": "ATATT3" + f.chars(URLSAFE, 186),
        "linear": "lin_api_" + f.chars(ALNUM, 40),
        "notion": "ntn_" + f.chars(string.digits, 11) + f.chars(ALNUM, 35),
        "huggingface": "hf_" + f.chars(string.ascii_letters, 34),
        "openai_project": "sk-proj-" + f.chars(URLSAFE, 74) + "T3BlbkFJ" + f.chars(URLSAFE, 74),
        "openai_legacy": "sk-" + f.chars(ALNUM, 20) + "T3BlbkFJ" + f.chars(ALNUM, 20),
        "anthropic": "sk-ant-api03-" + f.chars(URLSAFE, 93) + "AA",
        "grafana_cloud": "glc_" + f.chars(B64, 120) + "==",
        "grafana_service_account": "glsa_" + f.chars(ALNUM, 32) + "_" + f.chars(HEX, 8),
        "new_relic_user": "NRAK-" + f.chars(string.ascii_uppercase + string.digits, 27),
        "sentry_user": "sntryu_" + f.chars(HEX, 64),
        "dropbox": "sl." + f.chars(URLSAFE, 138),
        "postman": "PMAK-" + f.chars(HEX, 24) + "-" + f.chars(HEX, 34),
        "pulumi": "pul-" + f.chars(HEX, 40),
        "age": "AGE-SECRET-KEY-1" + f.chars(BECH32, 58),
        "google_api": "AIza" + f.chars(URLSAFE, 35),
        "google_oauth_secret": "GOCSPX-" + f.chars(URLSAFE, 28),
        "azure_ad_client_secret": f.chars(ALNUM, 3) + "8Q~" + f.chars(URLSAFE + "~.", 34),
        "alibaba": "LTAI" + f.chars(ALNUM, 20),
        "planetscale": "pscale_tkn_" + f.chars(URLSAFE, 43),
        "groq": "gsk_" + f.chars(ALNUM, 52),
        "perplexity": "pplx-" + f.chars(ALNUM, 48),
        "jwt": f.jwt(),
    }


def code_cases(f: Fake, t: dict[str, str]) -> list[dict]:
    pw, pw2, aws = f.password(), f.password(), f.aws_secret()
    cases = [
        (
            "python",
            f'import openai\nclient = openai.OpenAI(api_key="{t["openai_project"]}")\n',
            t["openai_project"],
        ),
        ("python", f'ANTHROPIC_API_KEY = "{t["anthropic"]}"\n', t["anthropic"]),
        (
            "python",
            f's3 = boto3.client(\n    "s3",\n    aws_access_key_id="{t["aws_access_key"]}",\n'
            f'    aws_secret_access_key="{aws}",\n)\n',
            aws,
        ),
        (
            "python",
            f's3 = boto3.client("s3", aws_access_key_id="{t["aws_access_key"]}")\n',
            t["aws_access_key"],
        ),
        (
            "python",
            f'DATABASES = {{\n    "default": {{\n        "ENGINE": "django.db.backends.postgresql",\n'
            f'        "USER": "app",\n        "PASSWORD": "{pw}",\n    }}\n}}\n',
            pw,
        ),
        ("python", f'conn = psycopg2.connect(host="db", user="app", password="{pw2}")\n', pw2),
        ("python", f'resp = requests.get(url, auth=("admin", "{pw}"), timeout=10)\n', pw),
        ("python", f'password = os.environ.get("DB_PASSWORD", "{pw2}")\n', pw2),
        ("python", f'def connect(host: str, password: str = "{pw}") -> Connection:\n    ...\n', pw),
        ("python", f'headers = {{"Authorization": "Bearer {t["jwt"]}"}}\n', t["jwt"]),
        ("python", f'g = Github("{t["github_pat"]}")\nrepo = g.get_repo("acme/api")\n', t["github_pat"]),
        ("python", f'os.environ["HF_TOKEN"] = "{t["huggingface"]}"\n', t["huggingface"]),
        ("python", f'self.secret_key = b"{pw2}"\n', pw2),
        (
            "python",
            f"STRIPE_WEBHOOK_SECRET = '{t['stripe_webhook']}'  # from the dashboard\n",
            t["stripe_webhook"],
        ),
        ("python", f'engine = create_engine("mysql+pymysql://root:{pw}@localhost:3306/shop")\n', pw),
        ("python", f'bot = telebot.TeleBot("{t["telegram_bot"]}")\n', t["telegram_bot"]),
        ("python", f'x = {{"password": "{pw2}", "user": "svc"}}\nlogin(**x)\n', pw2),
        ("javascript", f"const stripe = require('stripe')('{t['stripe_live']}');\n", t["stripe_live"]),
        (
            "javascript",
            f'const firebaseConfig = {{\n  apiKey: "{t["google_api"]}",\n'
            f'  authDomain: "acme.firebaseapp.com",\n}};\n',
            t["google_api"],
        ),
        ("javascript", f"const client = new Client({{ password: '{pw}', user: 'app' }});\n", pw),
        ("javascript", f'const token = process.env.SLACK_TOKEN || "{t["slack_bot"]}";\n', t["slack_bot"]),
        (
            "javascript",
            f"fetch(url, {{ headers: {{ Authorization: `Bearer {t['linear']}` }} }});\n",
            t["linear"],
        ),
        ("typescript", f'export const SENDGRID_API_KEY: string = "{t["sendgrid"]}";\n', t["sendgrid"]),
        ("typescript", f"private readonly apiSecret = '{pw2}';\n", pw2),
        ("go", f'const dbPassword = "{pw}"\n', pw),
        (
            "go",
            f'token := "{t["digitalocean_pat"]}"\nclient := godo.NewFromToken(token)\n',
            t["digitalocean_pat"],
        ),
        ("java", f'private static final String CLIENT_SECRET = "{pw2}";\n', pw2),
        ("csharp", f'var conn = "Server=tcp:sql.acme.net;Database=app;User Id=sa;Password={pw};";\n', pw),
        ("ruby", f"Stripe.api_key = '{t['stripe_restricted']}'\n", t["stripe_restricted"]),
        ("php", f"$config['db_password'] = '{pw2}';\n", pw2),
        ("php", f"return ['secret' => '{pw}', 'driver' => 'smtp'];\n", pw),
        ("rust", f'let api_token = "{t["pulumi"]}";\n', t["pulumi"]),
        ("kotlin", f'val mailchimpKey = "{t["mailchimp"]}"\n', t["mailchimp"]),
        ("swift", f'let twilioKey = "{t["twilio_api_key"]}"\n', t["twilio_api_key"]),
    ]
    return [{"kind": kind, "text": text, "secret": secret} for kind, text, secret in cases]


def config_cases(f: Fake, t: dict[str, str]) -> list[dict]:
    pw, pw2, pw3, aws = f.password(), f.password(), f.password(), f.aws_secret()
    ec_body = _indent(f.pem_body(3))
    gcp_body = f.pem_body(4).replace("\n", "\\n")
    basic = f.base64_of("ci:" + pw3)
    hashy = f"{f.chars(ALNUM, 6)}#{f.chars(ALNUM, 6)}"
    spaced = f"{f.chars(string.ascii_lowercase, 5)} {f.chars(ALNUM, 6)} {f.chars(ALNUM, 4)}$x"
    short_b64 = f.base64_of(pw3)
    account_key = f.chars(B64, 86) + "=="
    cases = [
        ("dotenv", f"DB_HOST=db\nDB_PASSWORD={hashy}\nDB_PORT=5432\n", hashy),
        ("dotenv", f'APP_SECRET="{spaced}"\n', spaced),
        ("dotenv", f"STRIPE_SECRET_KEY={t['stripe_live']}\n", t["stripe_live"]),
        ("dotenv", f"JWT_SECRET='{pw}'\n", pw),
        ("dotenv", f"REDIS_URL=redis://:{pw2}@cache:6379/0\n", pw2),
        ("dotenv", f"export GITHUB_TOKEN={t['github_fine_grained']}\n", t["github_fine_grained"]),
        ("dotenv", f"SMTP_PASS={pw3}\n", pw3),
        ("dotenv", f"SESSION_SECRET = {pw}\n", pw),
        ("dotenv", f"DATABASE_URL=postgres://app:{pw2}@db.internal:5432/app?sslmode=require\n", pw2),
        (
            "yaml",
            f"services:\n  db:\n    image: postgres:16\n    environment:\n"
            f"      POSTGRES_PASSWORD: {pw}\n      POSTGRES_USER: app\n",
            pw,
        ),
        (
            "yaml",
            f"services:\n  api:\n    environment:\n      - API_TOKEN={t['gitlab_pat']}\n",
            t["gitlab_pat"],
        ),
        ("yaml", f'spring:\n  datasource:\n    username: app\n    password: "{pw2}"\n', pw2),
        ("yaml", f"ansible_become_password: {hashy}\nansible_user: deploy\n", hashy),
        (
            "yaml",
            f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\ntype: Opaque\ndata:\n"
            f"  username: YXBw\n  password: {short_b64}\n",
            short_b64,
        ),
        ("yaml", f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: api\nstringData:\n  token: {pw3}\n", pw3),
        ("yaml", f"env:\n  - name: DATABRICKS_TOKEN\n    value: {t['databricks']}\n", t["databricks"]),
        ("yaml", f"jobs:\n  deploy:\n    env:\n      NPM_TOKEN: {t['npm']}\n", t["npm"]),
        ("yaml", f"vault:\n  token: '{t['vault_service']}'\n", t["vault_service"]),
        (
            "yaml",
            f"tls:\n  key: |\n    -----BEGIN EC PRIVATE KEY-----\n{ec_body}\n"
            f"    -----END EC PRIVATE KEY-----\n",
            ec_body,
        ),
        ("yaml", f"database:\n  password: |\n    {pw}\n  host: db\n", pw),
        ("toml", f'[tool.poetry.http-basic.private]\nusername = "ci"\npassword = "{pw3}"\n', pw3),
        ("toml", f"[registries.crates-io]\ntoken = '{t['heroku_v2']}'\n", t["heroku_v2"]),
        ("toml", f'[database]\nurl = "postgresql://app:{pw}@db/app"\n', pw),
        ("toml", f'secret = """{pw2}"""\n', pw2),
        (
            "ini",
            f"[distutils]\nindex-servers = pypi\n\n[pypi]\nusername = __token__\npassword = {t['pypi']}\n",
            t["pypi"],
        ),
        ("ini", f"[client]\nuser=root\npassword={hashy}\n", hashy),
        ("ini", f"[database]\nhost = db\npassword = {spaced.replace('$x', '')}\n", spaced.replace("$x", "")),
        ("ini", f"[alembic]\nsqlalchemy.url = postgresql://alembic:{pw2}@db/app\n", pw2),
        (
            "ini",
            f'[http "https://git.acme.net/"]\n\textraheader = AUTHORIZATION: basic {basic}\n',
            basic,
        ),
        ("properties", f"spring.datasource.password={pw}\nspring.datasource.username=app\n", pw),
        ("properties", f"mail.smtp.password = {hashy}\n", hashy),
        ("npmrc", f"//registry.npmjs.org/:_authToken={t['npm']}\n", t["npm"]),
        ("npmrc", f"//npm.acme.net/:_auth={f.base64_of('ci:' + pw2)}\n", f.base64_of("ci:" + pw2)),
        (
            "json",
            f'{{\n  "type": "service_account",\n  "project_id": "acme-prod",\n'
            f'  "private_key_id": "{f.chars(HEX, 40)}",\n'
            f'  "private_key": "-----BEGIN PRIVATE KEY-----\\n{gcp_body}\\n-----END PRIVATE KEY-----\\n",\n'
            f'  "client_email": "ci@acme-prod.iam.gserviceaccount.com"\n}}\n',
            gcp_body,
        ),
        (
            "json",
            f'{{"ConnectionStrings": {{"Storage": "DefaultEndpointsProtocol=https;AccountName=acme;'
            f'AccountKey={account_key};EndpointSuffix=core.windows.net"}}}}\n',
            account_key,
        ),
        (
            "json",
            f'{{"auths": {{"ghcr.io": {{"auth": "{f.base64_of("bot:" + t["github_pat"])}"}}}}}}\n',
            f.base64_of("bot:" + t["github_pat"]),
        ),
        ("json", f'{{"username": "svc", "password": "{pw}", "host": "db"}}\n', pw),
        ("json", f'{{"github-oauth": {{"github.com": "{t["github_oauth"]}"}}}}\n', t["github_oauth"]),
        ("json", f'{{"sqltools.connections": [{{"driver": "MySQL", "password": "{pw3}"}}]}}\n', pw3),
        (
            "xml",
            f"<settings>\n  <servers>\n    <server>\n      <id>nexus</id>\n      <username>ci</username>\n"
            f"      <password>{pw}</password>\n    </server>\n  </servers>\n</settings>\n",
            pw,
        ),
        (
            "xml",
            f'<appSettings>\n  <add key="ApiKey" value="{t["postman"]}" />\n</appSettings>\n',
            t["postman"],
        ),
        (
            "xml",
            f'<packageSourceCredentials>\n  <acme>\n    <add key="Username" value="ci" />\n'
            f'    <add key="ClearTextPassword" value="{pw2}" />\n  </acme>\n</packageSourceCredentials>\n',
            pw2,
        ),
        (
            "xml",
            f'<bean id="ds" class="x.DataSource">\n  <property name="password" value="{hashy}"/>\n</bean>\n',
            hashy,
        ),
        (
            "xml",
            f'<Resource name="jdbc/app" username="app" password="{pw3}" url="jdbc:mysql://db/app"/>\n',
            pw3,
        ),
        (
            "netrc",
            f"machine api.heroku.com\n  login me@acme.net\n  password {t['heroku_v2']}\n",
            t["heroku_v2"],
        ),
        ("netrc", f"machine github.com login octocat password {pw}\n", pw),
        ("netrc", f"default login anonymous password {pw2}\n", pw2),
        ("pgpass", f"db.internal:5432:app:app:{pw3}\n", pw3),
        ("pgpass", f"*:*:*:postgres:{hashy}\n", hashy),
        ("dockerfile", f"FROM node:20\nARG NPM_TOKEN={t['npm']}\nRUN npm ci\n", t["npm"]),
        ("dockerfile", f"ENV SENTRY_AUTH_TOKEN={t['sentry_user']}\n", t["sentry_user"]),
        (
            "terraform",
            f'provider "aws" {{\n  access_key = "{t["aws_session_key"]}"\n  secret_key = "{aws}"\n}}\n',
            aws,
        ),
        (
            "terraform",
            f'resource "azurerm_sql_server" "db" {{\n  administrator_login_password = "{pw}"\n}}\n',
            pw,
        ),
        (
            "hcl",
            f'credentials "app.terraform.io" {{\n  token = "{t["terraform_cloud"]}"\n}}\n',
            t["terraform_cloud"],
        ),
    ]
    return [{"kind": kind, "text": text, "secret": secret} for kind, text, secret in cases]


def _indent(text: str, n: int = 4) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


def shell_and_log_cases(f: Fake, t: dict[str, str]) -> list[dict]:
    pw, pw2, pw3, aws = f.password(), f.password(), f.password(), f.aws_secret()
    b64 = f.base64_of("admin:" + pw2)
    session = f.chars(ALNUM, 32)
    slack_hook = (
        f"T{f.chars(string.ascii_uppercase + string.digits, 8)}/B{f.chars(string.ascii_uppercase, 10)}/"
    )
    slack_hook += f.chars(ALNUM, 24)
    sentry_key = f.chars(HEX, 32)
    cases = [
        ("shell", f"curl -u admin:{pw} https://jenkins.acme.net/api/json\n", pw),
        ("shell", f"curl --user 'deploy:{pw2}' -X POST https://ci.acme.net/job/build\n", pw2),
        (
            "shell",
            f'curl -H "Authorization: Bearer {t["github_app"]}" https://api.github.com/user\n',
            t["github_app"],
        ),
        (
            "shell",
            f'curl -H "X-Api-Key: {t["new_relic_user"]}" https://api.newrelic.com/v2/apps.json\n',
            t["new_relic_user"],
        ),
        (
            "shell",
            f"curl -H 'PRIVATE-TOKEN: {t['gitlab_pat']}' https://gitlab.com/api/v4/projects\n",
            t["gitlab_pat"],
        ),
        ("shell", f"curl -s https://api.telegram.org/bot{t['telegram_bot']}/getMe\n", t["telegram_bot"]),
        (
            "shell",
            f"curl -d 'client_id=web&client_secret={pw3}&grant_type=client_credentials' https://auth\n",
            pw3,
        ),
        ("shell", f"mysql -h db -u root -p{pw} shop < dump.sql\n", pw),
        ("shell", f"mysqldump -uroot -p'{pw2}' --all-databases > all.sql\n", pw2),
        ("shell", f"docker login -u acme -p {pw3} registry.acme.net\n", pw3),
        ("shell", f"sshpass -p '{pw}' ssh deploy@10.0.0.5\n", pw),
        ("shell", f"export OPENAI_API_KEY={t['openai_legacy']}\n", t["openai_legacy"]),
        ("shell", f"git clone https://oauth2:{t['gitlab_pat']}@gitlab.com/acme/api.git\n", t["gitlab_pat"]),
        (
            "shell",
            f"git remote add origin https://{t['github_pat']}@github.com/acme/api.git\n",
            t["github_pat"],
        ),
        ("shell", f"psql \"postgresql://app:{pw2}@db.internal:5432/app\" -c 'select 1'\n", pw2),
        ("shell", f"app --db-password={pw3} --port 8080\n", pw3),
        ("shell", f"vault login -method=userpass username=admin password={pw}\n", pw),
        ("shell", f"deploy --token {t['doppler_personal']} --env prod\n", t["doppler_personal"]),
        ("shell", f"aws configure set aws_secret_access_key {aws}\n", aws),
        ("shell", f"kubectl create secret generic db --from-literal=password={pw3}\n", pw3),
        ("shell", f"heroku config:set STRIPE_KEY={t['stripe_restricted']} -a acme\n", t["stripe_restricted"]),
        ("shell", f"docker run -e POSTGRES_PASSWORD={pw} -d postgres:16\n", pw),
        ("shell", f'echo "{t["age"]}" > key.txt && age -d -i key.txt secrets.age\n', t["age"]),
        ("shell", f"PGPASSWORD='{pw2}' pg_dump -h db app > app.sql\n", pw2),
        ("log", f"2024-05-01 12:00:01 INFO connecting to postgres://app:{pw3}@db:5432/app\n", pw3),
        (
            "log",
            f"2024-05-01 12:00:02 DEBUG request headers: {{'Authorization': 'Basic {b64}', "
            f"'Accept': '*/*'}}\n",
            b64,
        ),
        (
            "log",
            f'127.0.0.1 - - [01/May/2024:12:00:03 +0000] "GET /v1/data?api_key={t["mailgun"]}&limit=10 '
            f'HTTP/1.1" 200 512\n',
            t["mailgun"],
        ),
        (
            "log",
            f'level=info msg="login ok" user=bob token={t["slack_user"]} duration=12ms\n',
            t["slack_user"],
        ),
        (
            "log",
            f"> GET /me HTTP/1.1\n> Host: api.acme.net\n> Cookie: sessionid={session}; theme=dark\n",
            session,
        ),
        ("log", f"< HTTP/1.1 200 OK\n< Set-Cookie: session={pw}; Path=/; HttpOnly\n", pw),
        ("log", f'WARN retrying with credentials {{"user": "svc", "password": "{pw2}"}}\n', pw2),
        (
            "log",
            f"requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: "
            f"https://api.acme.net/v1/items?access_token={t['dropbox']}\n",
            t["dropbox"],
        ),
        ("log", f"ERROR webhook failed: https://hooks.slack.com/services/{slack_hook}\n", slack_hook),
        (
            "log",
            f"sentry dsn https://{sentry_key}@o{f.chars(string.digits, 6)}.ingest.sentry.io/"
            f"{f.chars(string.digits, 7)} configured\n",
            sentry_key,
        ),
        ("log", f"Authorization: Token {t['grafana_service_account']}\n", t["grafana_service_account"]),
        (
            "traceback",
            f'Traceback (most recent call last):\n  File "/app/db.py", line 12, in connect\n'
            f'    conn = psycopg2.connect("dbname=app user=app password={pw3} host=db")\n'
            f"psycopg2.OperationalError: could not connect to server\n",
            pw3,
        ),
        (
            "traceback",
            f'  File "/app/settings.py", line 3, in <module>\n'
            f"    DISCORD_TOKEN = '{t['discord_bot']}'\nNameError: name 'x' is not defined\n",
            t["discord_bot"],
        ),
        ("traceback", f"Exception: bad key {t['atlassian']}\n", t["atlassian"]),
        ("http", f"POST /oauth/token HTTP/1.1\nHost: auth.acme.net\nAuthorization: Basic {b64}\n\n", b64),
        ("http", f"GET /api HTTP/1.1\nX-Vault-Token: {t['vault_batch']}\n", t["vault_batch"]),
        ("http", f"GET /api HTTP/1.1\nAuthorization: Bearer {t['jwt']}\n", t["jwt"]),
    ]
    return [{"kind": kind, "text": text, "secret": secret} for kind, text, secret in cases]


def key_cases(f: Fake, t: dict[str, str]) -> list[dict]:
    rsa, ec, ossh, enc, pgp, putty = (f.pem_body(n) for n in (8, 3, 6, 6, 10, 8))
    mac = f.chars(HEX, 64)
    rsa_escaped, ec_escaped = rsa.replace("\n", "\\n"), ec.replace("\n", "\\n")
    ossh_b64 = f.base64_of("-----BEGIN OPENSSH PRIVATE KEY-----\n" + ossh)
    cases = [
        ("pem", f"-----BEGIN RSA PRIVATE KEY-----\n{rsa}\n-----END RSA PRIVATE KEY-----\n", rsa),
        ("pem", f"key = '''-----BEGIN EC PRIVATE KEY-----\n{ec}\n-----END EC PRIVATE KEY-----'''\n", ec),
        ("pem", f"-----BEGIN OPENSSH PRIVATE KEY-----\n{ossh}\n-----END OPENSSH PRIVATE KEY-----\n", ossh),
        ("pem", f"-----BEGIN ENCRYPTED PRIVATE KEY-----\n{enc}\n-----END ENCRYPTED PRIVATE KEY-----\n", enc),
        ("pem", f"-----BEGIN DSA PRIVATE KEY-----\n{ec}\n-----END DSA PRIVATE KEY-----\n", ec),
        (
            "pgp",
            f"-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: GnuPG v2\n\n{pgp}\n=Ab12\n"
            f"-----END PGP PRIVATE KEY BLOCK-----\n",
            pgp,
        ),
        (
            "putty",
            f"PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: deploy\nPublic-Lines: 2\n"
            f"{f.pem_body(2)}\nPrivate-Lines: 8\n{putty}\nPrivate-MAC: {mac}\n",
            putty,
        ),
        (
            "putty",
            f"PuTTY-User-Key-File-2: ssh-rsa\nEncryption: none\nComment: ci\nPublic-Lines: 1\n"
            f"{f.pem_body(1)}\nPrivate-Lines: 8\n{putty}\nPrivate-MAC: {mac}\n",
            mac,
        ),
        (
            "pem_in_json",
            f'{{"key": "-----BEGIN PRIVATE KEY-----\\n{rsa_escaped}\\n-----END PRIVATE KEY-----\\n"}}\n',
            rsa_escaped,
        ),
        (
            "pem_in_env",
            f'PRIVATE_KEY="-----BEGIN RSA PRIVATE KEY-----\\n{ec_escaped}\\n-----END RSA PRIVATE KEY-----"\n',
            ec_escaped,
        ),
        ("pem_unterminated", f"-----BEGIN RSA PRIVATE KEY-----\n{rsa}\n", rsa),
        ("pem_base64_env", f"SSH_KEY={ossh_b64}\n", ossh_b64),
    ]
    return [{"kind": kind, "text": text, "secret": secret} for kind, text, secret in cases]


def more_code_and_config_cases(f: Fake, t: dict[str, str]) -> list[dict]:
    """Shapes found by probing after the first corpus: setters, SQL, notebooks, k8s env pairs."""
    pw, pw2, pw3, pw4 = f.password(), f.password(), f.password(), f.password()
    cases = [
        ("go", f'os.Setenv("DB_PASSWORD", "{pw}")\n', pw),
        ("python", f'os.environ.setdefault("API_TOKEN", "{pw2}")\n', pw2),
        ("java", f'System.setProperty("db.password", "{pw3}");\n', pw3),
        ("python", f'user, password = "svc", "{pw4}"\n', pw4),
        ("sql", f"CREATE USER app WITH PASSWORD '{pw}';\n", pw),
        ("sql", f"cur.execute(\"ALTER ROLE app WITH PASSWORD '{pw2}'\")\n", pw2),
        ("nginx", f'proxy_set_header X-Api-Key "{pw3}";\n', pw3),
        ("notebook", f'  "source": [\n    "password = \\"{pw4}\\"\\n",\n    "connect(password)"\n  ]\n', pw4),
        ("yaml", f"db:\n  password: &db_password {pw}\nreplica:\n  password: *db_password\n", pw),
        (
            "yaml",
            f"containers:\n  - name: api\n    env:\n      - name: DB_PASSWORD\n        value: {pw2}\n",
            pw2,
        ),
        ("json", f'{{"environment": [{{"name": "STRIPE_SECRET", "value": "{pw3}"}}]}}\n', pw3),
        ("xml", f'<map>\n  <entry key="password">{pw4}</entry>\n</map>\n', pw4),
        ("xml", f'<parameters>\n  <parameter name="apiToken">{pw}</parameter>\n</parameters>\n', pw),
        ("log", f"DEBUG auth user=admin pass={pw2} ok\n", pw2),
        ("shell", f"az login --service-principal -u http://ci-app -p {pw3} --tenant acme\n", pw3),
        ("shell", f"helm upgrade api ./chart --set db.password={pw4}\n", pw4),
        ("systemd", f'[Service]\nEnvironment="DB_PASSWORD={pw}"\n', pw),
        ("docker-compose", f'services:\n  db:\n    environment:\n      - "MYSQL_ROOT_PASSWORD={pw2}"\n', pw2),
        ("jdbc", f"jdbc:postgresql://db:5432/app?user=app&password={pw3}&ssl=true\n", pw3),
        ("url", f"DATABASE_URL=mysql://app:p@ss:{pw4}@db/app\n", pw4),
    ]
    return [{"kind": kind, "text": text, "secret": secret} for kind, text, secret in cases]


def bare_token_cases(f: Fake, t: dict[str, str]) -> list[dict]:
    """Every provider token on its own in a line of code, a log and prose."""
    templates = [
        'TOKEN = "{}"\n',
        "INFO using credential {} for upload\n",
        "  - run: ./publish.sh {}\n",
    ]
    return [
        {"kind": kind, "text": templates[i % len(templates)].format(token), "secret": token}
        for i, (kind, token) in enumerate(sorted(t.items()))
    ]


CLEAN = [
    "password = get_password()\n",
    "token = self.token\n",
    "items.sort(key=lambda x: x.name)\n",
    "def login(user: str, api_key: str) -> Session:\n",
    "class Settings(BaseModel):\n    api_key: str\n    password: SecretStr\n",
    "    token: Optional[str] = None\n",
    "password = input('Password: ')\n",
    "if not password:\n    raise ValueError('password required')\n",
    "secret = config.secret\napi_key = os.environ['API_KEY']\n",
    "token = tokens[i]\nnext_token = next(it)\n",
    "headers = {'Authorization': f'Bearer {token}'}\n",
    "headers['Authorization'] = 'Bearer ' + token\n",
    "const apiKey = process.env.API_KEY;\n",
    "const { password } = req.body;\n",
    "interface User { password: string; token?: string }\n",
    "password_hash = hashlib.sha256(password.encode()).hexdigest()\n",
    "MAX_PASSWORD_LENGTH = 128\nTOKEN_TTL_SECONDS = 3600\n",
    "DB_PASSWORD: ${{ secrets.DB_PASSWORD }}\n",
    "password: ${DB_PASSWORD}\n",
    'api_key: "{{ .Values.apiKey }}"\n',
    "export API_TOKEN=$(cat /run/secrets/api_token)\n",
    "secretKeyRef:\n  name: db\n  key: password\n",
    "cache_key = f'user:{user_id}'\nsort_key = 'created_at'\n",
    "for key, value in sorted(d.items()):\n    print(key, value)\n",
    "git clone https://github.com/python/cpython.git\n",
    "ssh://git@github.com/acme/api.git\n",
    "# The password must be at least 12 characters long.\n",
    "Run `docker login --password-stdin` and paste the token.\n",
    "token = Token(kind=TokenKind.NAME, text=name)\n",
    "auth = HTTPBasicAuth(user, password)\n",
    "session = requests.Session()\nsession.auth = (user, password)\n",
    "if token == '(':\n    depth += 1\n",
    "signature = inspect.signature(func)\n",
    "salt = os.urandom(16)\n",
    "self.user, self.password = user, password\n",
    'curl -u "$USER:$PASS" https://example.com\n',
    "mysql -u root -p\n",
    "url = 'https://example.com/api/v1/users?page=2'\n",
    "print(f'token={token!r}')\n",
    "x = f'token {token:02x}'\n",
    "    (the default of None has the same effect), or pass 'ignore' to ignore\n",
    "pass_stmt: 'pass'\n",
    "raise TypeError('pwd: expected bytes, got %s' % type(pwd).__name__)\n",
]


def build_corpus(seed: int = SEED) -> dict:
    fake = Fake(seed)
    tokens = provider_tokens(fake)
    secrets = [
        *code_cases(fake, tokens),
        *config_cases(fake, tokens),
        *shell_and_log_cases(fake, tokens),
        *key_cases(fake, tokens),
        *bare_token_cases(fake, tokens),
        *more_code_and_config_cases(fake, tokens),
    ]
    return {"seed": seed, "secrets": secrets, "clean": CLEAN}


def leaks(case: dict) -> list[str]:
    """The parts of the case's secret still in the redacted text: all of it, or 8-character pieces."""
    text = re.sub(r"\[REDACTED:[\w.-]+\]", "", redact(case["text"]).text)
    secret = case["secret"]
    if secret in text:
        return [secret]
    pieces = {secret[i : i + 8] for i in range(len(secret) - 7)} if len(secret) > 8 else set()
    return sorted(p for p in pieces if p in text and p not in case["text"].replace(secret, ""))


CORPUS = json.loads(CORPUS_PATH.read_text()) if CORPUS_PATH.exists() else build_corpus()


def test_the_corpus_file_is_what_the_generator_writes():
    assert CORPUS == build_corpus(CORPUS["seed"])


def test_at_least_150_cases_and_no_secret_leaks():
    leaked = {f"{i}:{case['kind']}": leaks(case) for i, case in enumerate(CORPUS["secrets"])}
    leaked = {k: v for k, v in leaked.items() if v}
    assert len(CORPUS["secrets"]) >= 150
    assert leaked == {}


@pytest.mark.parametrize(
    "case", CORPUS["secrets"], ids=[f"{i}-{c['kind']}" for i, c in enumerate(CORPUS["secrets"])]
)
def test_each_secret_is_gone(case):
    assert leaks(case) == [], redact(case["text"]).text


@pytest.mark.parametrize("text", CORPUS["clean"])
def test_secret_free_code_comes_back_unchanged(text):
    assert redact(text).text == text


def test_redacting_twice_changes_nothing_more():
    for case in CORPUS["secrets"]:
        once = redact(case["text"]).text
        assert redact(once).text == once, case["kind"]


if __name__ == "__main__":
    CORPUS_PATH.write_text(json.dumps(build_corpus(), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {CORPUS_PATH}", file=sys.stderr)
