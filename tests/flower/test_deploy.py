"""The local deployment recipe (examples/flower-fedcor/deploy) and fedselect's forking SuperExec.

The recipe itself runs end to end in CI (.ci/flower-deployment: TLS, SuperNode authentication,
three registered SuperNodes, two unauthenticated ones that must be refused); these tests check
its parts in seconds: the credentials Flower must accept, what the app bundle must not carry,
what the recipe must not do, and that the SuperExec's fork runs Flower's ClientApp entry point
with the task's token and the Runtime API's CA.
"""

import ast
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from io import BytesIO
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("flwr")

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "flower-fedcor"
DEPLOY = APP / "deploy"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_generated_credentials_are_what_flower_accepts(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key
    from flwr.cli.supernode.register import try_load_public_key

    out = tmp_path / "cred"
    subprocess.run(["bash", str(DEPLOY / "generate_credentials.sh"), "2", str(out)], check=True,
                   capture_output=True, text=True)
    # The server certificate: signed by the CA, for the names the recipe connects to.
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((out / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} >= {"127.0.0.1", "::1"}
    subprocess.run(["openssl", "verify", "-CAfile", str(out / "ca.crt"), str(out / "server.pem")], check=True,
                   capture_output=True)
    # One key pair per SuperNode, in the formats `flwr supernode register` and flower-supernode load.
    for i in range(2):
        public = try_load_public_key(out / f"supernode-{i}.pub")  # what `flwr supernode register` sends
        private = load_ssh_private_key((out / f"supernode-{i}").read_bytes(), None)
        assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
        assert public == try_load_public_key(out / f"supernode-{i}.pub")
    assert try_load_public_key(out / "supernode-0.pub") != try_load_public_key(out / "supernode-1.pub")
    # Each SuperNode its own TLS certificate (signed by the CA) and SuperExec secret; none holds server.key.
    for i in range(2):
        own = x509.load_pem_x509_certificate((out / f"supernode-{i}-tls.pem").read_bytes())
        own.verify_directly_issued_by(ca)
        assert own.public_key() != server.public_key()
        assert len((out / f"supernode-{i}.secret").read_bytes()) == 32
    assert (out / "supernode-0.secret").read_bytes() != (out / "supernode-1.secret").read_bytes()
    assert len((out / "superlink.secret").read_bytes()) == 32
    # Private keys and secrets are readable by their owner only.
    for name in ("ca.key", "server.key", "supernode-0", "supernode-1", "supernode-0-tls.key", "supernode-0.secret",
                 "superlink.secret"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    # Run again with more nodes: existing files are kept, the missing key pair is added.
    before = (out / "supernode-0").read_bytes(), (out / "ca.crt").read_bytes()
    subprocess.run(["bash", str(DEPLOY / "generate_credentials.sh"), "3", str(out)], check=True, capture_output=True)
    assert ((out / "supernode-0").read_bytes(), (out / "ca.crt").read_bytes()) == before
    assert (out / "supernode-2.pub").is_file()


def test_the_app_bundle_leaves_the_deploy_folder_out(tmp_path):
    """`flwr run` bundles the app folder: the deployment's run directory (flwr's config, records, node lists)
    and its credentials must not travel to the SuperLink and every SuperNode with the app."""
    from flwr.cli.build import build_fab_from_disk

    app = tmp_path / "flower-fedcor"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__", "run", "credentials"))
    (app / "deploy" / "run" / "flwr-home").mkdir(parents=True)
    (app / "deploy" / "run" / "flwr-home" / "config.toml").write_text("[superlink]\n")
    (app / "deploy" / "run" / "records.jsonl").write_text("{}\n")
    (app / "deploy" / "credentials").mkdir()
    (app / "deploy" / "credentials" / "keys.json").write_text("{}\n")
    names = zipfile.ZipFile(BytesIO(build_fab_from_disk(app))).namelist()
    assert "fedcor_app/server_app.py" in names and "fedcor_app/client_app.py" in names
    assert not [n for n in names if n.startswith("deploy/")], names


def test_the_recipe_uses_tls_and_supernode_authentication_everywhere():
    script = (DEPLOY / "run_local.sh").read_text()
    assert "--insecure" not in script
    assert "--enable-supernode-auth" in script
    assert re.search(r"flower-superlink --ssl-ca-certfile \S+ --ssl-certfile \S+ --ssl-keyfile", script)
    assert "--auth-supernode-private-key" in script and "flwr supernode register" in script
    assert 'root-certificates = "$CRED/ca.crt"' in script
    # flwr run: num-clients is the number of SuperNodes, and the log is streamed.
    assert re.search(r"flwr run examples/flower-fedcor fedselect-local --stream", script)
    assert "num-clients=$NODES" in script
    # Closed: SuperNodes are given the Fleet-only gateway's address, never the SuperLink's own; each
    # serves its Runtime API with its own certificate; SuperExec secrets are set; ids are bound.
    nodes = re.findall(r"flower-supernode --superlink (\S+)", script)
    assert nodes and set(nodes) == {'"$FLEET_HOST:$FLEET_PORT"'}
    assert "fleet_gateway.py" in script and '--ssl-keyfile "$CRED/server.key"' in script
    assert script.count("$CRED/server.key") == 2  # the SuperLink and the gateway, no SuperNode
    assert '--ssl-keyfile "$CRED/supernode-$i-tls.key"' in script
    assert '--superexec-auth-secret-file "$CRED/superlink.secret"' in script
    assert '--superexec-auth-secret-file "$CRED/supernode-$i.secret"' in script
    assert "node-binding-path='$WORK/node-binding.json'" in script
    # The rogue check tries a self-registering stranger and an unbound node claiming client 0.
    assert 'FLWR_HOME="$WORK/stranger-home" flwr supernode register' in script
    assert "is not in node_binding" in script
    # Processes are stopped by the PIDs the recipe recorded, never by name.
    assert "pkill" not in script and "killall" not in script
    docs = (ROOT / "docs" / "flower.rst").read_text()
    assert not re.search(r"pkill\s+-|pkill\s+flower|killall", docs), "the docs end processes by name"


def _gateway():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fleet_gateway", DEPLOY / "fleet_gateway.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_the_gateway_forwards_the_fleet_api_only(tmp_path):
    """The Control API (which registers keys: a stranger joined with `flwr supernode register`) and the
    Runtime API get 403 at the SuperNodes' address; a Fleet API request is forwarded (here to a SuperLink
    that is not there: 502)."""
    from starlette.testclient import TestClient

    subprocess.run(["bash", str(DEPLOY / "generate_credentials.sh"), "1", str(tmp_path)], check=True,
                   capture_output=True)
    gateway = _gateway()
    with TestClient(gateway.make_app("127.0.0.1:9", str(tmp_path / "ca.crt"))) as client:
        for method, path in [("POST", "/v1/control/register-node"), ("POST", "/v1/control/start-run"),
                             ("POST", "/v1/runtime/pull-app-inputs"), ("GET", "/v1/fleet/pull-messages"),
                             ("POST", "/v1/fleet/../control/register-node"), ("POST", "/v1/fleet/a/b"),
                             ("POST", "/"), ("POST", "/v1/fleetx/pull-messages")]:
            assert client.request(method, path, content=b"x").status_code == 403, (method, path)
        assert client.post("/v1/fleet/pull-messages", content=b"x").status_code == 502


def test_the_recipe_and_the_docs_show_the_same_blocks():
    """docs/flower.rst shows the recipe's [docs:NAME] blocks with literalinclude, so what the docs say is what
    CI runs; every block it names exists in the script."""
    script = (DEPLOY / "run_local.sh").read_text()
    docs = (ROOT / "docs" / "flower.rst").read_text()
    named = re.findall(r":start-after: \[docs:([a-z]+)\]", docs)
    assert {"settings", "superlink", "register", "supernodes", "run", "check"} <= set(named)
    for name in named:
        assert f"# [docs:{name}]\n" in script and f"# [/docs:{name}]\n" in script, name


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX only")
def test_the_fork_executor_runs_flowers_clientapp_entry_point(tmp_path, monkeypatch):
    """The child runs flwr.supernode.runtime.run_clientapp.run_clientapp with the task's address, token, TLS
    root certificates (read from the spec's path) and parent PID, and exits with its exit code."""
    import flwr.supernode.runtime.run_clientapp as rc
    from flwr.supercore.superexec.executor import LaunchResultStatus

    from fedselect.flower.superexec import ForkExecutor

    seen = tmp_path / "seen.txt"

    def fake_run_clientapp(**kwargs):
        seen.write_text(repr(sorted(kwargs.items())))
        sys.exit(7)

    monkeypatch.setattr(rc, "run_clientapp", fake_run_clientapp)
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n")
    spec = SimpleNamespace(task_type="flwr-clientapp", runtime_api_address="127.0.0.1:1234", token="tok-1",
                           insecure=False, root_certificates_path=str(ca), runtime_dependency_install=False,
                           parent_pid=os.getpid())
    executor = ForkExecutor()
    assert executor.launch(spec).status == LaunchResultStatus.ACCEPTED
    (pid,) = executor.children
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7
    kwargs = dict(ast.literal_eval(seen.read_text()))
    assert kwargs == {"runtime_api_address": "127.0.0.1:1234", "token": "tok-1", "insecure": False,
                      "certificates": ca.read_bytes(), "parent_pid": os.getpid(),
                      "runtime_dependency_install": False}
    executor.reconcile()
    assert executor.children == set()
    # Only ClientApp tasks: a ServerApp task is refused, not forked.
    other = SimpleNamespace(**{**vars(spec), "task_type": "flwr-serverapp"})
    assert executor.launch(other).status == LaunchResultStatus.FAILED
    assert executor.children == set()


def test_the_superexec_requires_a_tls_choice(capsys):
    from fedselect.flower.superexec import main

    with pytest.raises(SystemExit):
        main(["--runtime-api-address", "127.0.0.1:1"])  # neither --insecure nor --root-certificates
    assert "--insecure" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no such file"):
        main(["--runtime-api-address", "127.0.0.1:1", "--root-certificates", "/nonexistent/ca.crt"])
