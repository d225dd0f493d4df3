"""Two-factor login (a key, then a keyboard-interactive one-time password, as at the facilities)
against a real SSH server: paramiko's server side in a thread, since the test sshd has no PAM."""

from __future__ import annotations

import getpass
import os
import socket
import sys
import threading
from pathlib import Path

import paramiko
import pytest

from mmm_orch.hosts.ssh import SshError, SshHost

OTP = "918273"


class TwoFactorServer(paramiko.ServerInterface):
    def __init__(self, client_key: paramiko.PKey):
        self.client_key = client_key
        self.prompts = 0

    def get_allowed_auths(self, username):
        return "publickey,keyboard-interactive"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_PARTIALLY_SUCCESSFUL if key == self.client_key else paramiko.AUTH_FAILED

    def check_auth_interactive(self, username, submethods):
        self.prompts += 1
        return paramiko.InteractiveQuery("MobilePASS", "Enter your one-time passcode", ("Passcode: ", False))

    def check_auth_interactive_response(self, responses):
        return paramiko.AUTH_SUCCESSFUL if list(responses) == [OTP] else paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        # Output and exit status only; the client closes the channel. (A close from here could
        # overtake the server's reply to the exec request.)
        channel.sendall(b"ran: " + command + b"\n")
        channel.send_exit_status(0)
        return True


@pytest.fixture
def server(isolated):
    host_key = paramiko.RSAKey.generate(2048)
    client_key = paramiko.RSAKey.generate(2048)
    ssh = Path(os.environ["HOME"]) / ".ssh"
    ssh.mkdir(parents=True)
    client_key.write_private_key_file(str(ssh / "id_rsa"))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    (ssh / "known_hosts").write_text(f"[127.0.0.1]:{port} ssh-rsa {host_key.get_base64()}\n")
    interface = TwoFactorServer(client_key)
    transports = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(host_key)
            transport.start_server(server=interface)
            transports.append(transport)

    threading.Thread(target=serve, daemon=True).start()
    yield port, interface
    listener.close()
    for transport in transports:
        transport.close()


def test_key_then_one_time_password_on_the_terminal(server, monkeypatch):
    port, interface = server
    asked = []
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr(getpass, "getpass", lambda prompt: asked.append(prompt) or OTP)
    host = SshHost(f"tester@127.0.0.1:{port}")
    try:
        result = host.run(["squeue", "--me"], cwd="/tmp/a dir")
        again = host.run(["echo", "$(id)"])
    finally:
        host.close()
    assert result.returncode == 0 and result.stdout == "ran: bash -lc 'cd '\"'\"'/tmp/a dir'\"'\"' && squeue --me'\n"
    assert again.stdout == "ran: bash -lc 'echo '\"'\"'$(id)'\"'\"''\n"  # quoted: never expanded there
    assert asked == ["Passcode: "] and interface.prompts == 1  # once for the whole command


def test_no_terminal_to_ask_on_is_a_clear_error(server, monkeypatch):
    port, _ = server
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    host = SshHost(f"tester@127.0.0.1:{port}")
    with pytest.raises(SshError, match="keyboard-interactive input .* no terminal"):
        host.run(["true"])
    host.close()


def test_wrong_passcode_fails_authentication(server, monkeypatch):
    port, _ = server
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr(getpass, "getpass", lambda prompt: "000000")
    host = SshHost(f"tester@127.0.0.1:{port}")
    with pytest.raises(SshError, match=r"authentication as tester@127\.0\.0\.1 failed .*keyboard-interactive"):
        host.run(["true"])
    host.close()
