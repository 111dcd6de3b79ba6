"""`convergerd policy apply|delete` never follows a redirect: it would carry the bearer token to
wherever `Location` points. A 3xx is an error naming its status and the (escaped, shortened)
`Location`, and the other server hears nothing."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator

import pytest

from convergerd.cli.policy import Failed, call

TOKEN = "redirect-test-token-7d1f"


@contextlib.contextmanager
def server(location: str | None, heard: list[str], code: int = 302) -> Iterator[int]:
    """A server answering every request `code` to `location` (or 200 with `{}` when None),
    noting the Authorization headers it hears; yields its port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            heard.append(self.headers.get("Authorization", ""))
            if location is None:  # what urllib would do after a 301-303: GET with the token
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                return
            self.send_response(code)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_DELETE = answer  # noqa: N815 - http.server's names

        def log_message(self, format: str, *args: object) -> None:
            return

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("method", ["POST", "DELETE"])
def test_a_redirect_is_an_error_and_the_token_goes_nowhere_else(method: str, code: int) -> None:
    elsewhere: list[str] = []
    with server(None, elsewhere) as other:
        target = f"http://127.0.0.1:{other}/collect\n\x1b[31m" + "x" * 500
        daemon: list[str] = []
        with server(target, daemon, code) as port, pytest.raises(Failed) as caught:
            call(f"127.0.0.1:{port}", method, "/v1/policies/p1/apply", token=TOKEN, body=None,
                 timeout_s=5)
    message = str(caught.value)
    assert f"answered {code}, a redirect to http://127.0.0.1:" in message
    assert "not followed" in message
    assert "\n" not in message
    assert "\x1b" not in message
    assert len(message) < 400
    assert daemon == [f"Bearer {TOKEN}"]
    assert elsewhere == []  # the token did not follow the redirect
