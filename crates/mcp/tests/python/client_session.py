#!/usr/bin/env python3
"""Drive `ailab-sandbox mcp` with the official MCP Python SDK (`pip install mcp`).

Launches the binary over stdio with temporary --root/--state-dir directories and
--enable-write --no-dry-run, then lists the tools, writes, transforms, reads, refuses an
escape, rolls back and checks the bytes on disk at every step. Prints one line per
step; exits non-zero on the first failure.

Usage:
    python3 crates/mcp/tests/python/client_session.py [PATH/TO/ailab-sandbox]

The binary defaults to $AILAB_SANDBOX_BIN, then target/debug/ailab-sandbox of this
workspace (build it with `cargo build -p ailab-sandbox`), then `ailab-sandbox` on PATH.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

WRITE_TOOLS = {
    "create_file", "append_file", "replace_file", "create_directory", "write_json",
    "write_yaml", "write_markdown", "generate_report", "generate_config",
    "generate_script", "sandbox_transform",
}
OTHER_TOOLS = {
    "read_file", "list_directory", "get_file_info", "rollback_workflow",
    "rollback_action", "list_artifacts", "get_artifact", "get_state",
}


class StepFailed(Exception):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise StepFailed(what)


def step(name: str, detail: str) -> None:
    print(f"ok   {name}: {detail}", flush=True)


def find_binary() -> str:
    if len(sys.argv) > 1:
        return sys.argv[1]
    if os.environ.get("AILAB_SANDBOX_BIN"):
        return os.environ["AILAB_SANDBOX_BIN"]
    workspace = Path(__file__).resolve().parents[4]
    built = workspace / "target" / "debug" / "ailab-sandbox"
    if built.exists():
        return str(built)
    found = shutil.which("ailab-sandbox")
    if found:
        return found
    raise StepFailed("ailab-sandbox binary not found; run `cargo build -p ailab-sandbox` or pass its path")


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def call_ok(session: ClientSession, tool: str, args: dict):
    result = await session.call_tool(tool, args)
    check(not result.is_error, f"{tool} returned isError: {text_of(result)}")
    return result


async def session_run(binary: str, root: Path, state: Path, errlog) -> None:
    params = StdioServerParameters(
        command=binary,
        args=["--root", str(root), "--state-dir", str(state), "--enable-write", "--no-dry-run", "mcp"],
    )
    async with stdio_client(params, errlog=errlog) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            check(init.server_info.name == "ailab-sandbox", f"server name {init.server_info.name!r}")
            check(init.capabilities.tools is not None, "tools capability missing")
            step("initialize", f"{init.server_info.name} {init.server_info.version}, protocol {init.protocol_version}")

            tools = (await session.list_tools()).tools
            names = {t.name for t in tools}
            check(names == WRITE_TOOLS | OTHER_TOOLS, f"tool names {sorted(names)}")
            create = next(t for t in tools if t.name == "create_file")
            check(create.input_schema.get("required") == ["path", "content"], f"create_file schema {create.input_schema}")
            check(create.input_schema.get("additionalProperties") is False, "additionalProperties is not false")
            step("tools/list", f"{len(tools)} tools: {len(WRITE_TOOLS)} write tools + {', '.join(sorted(OTHER_TOOLS))}")

            target = root / "notes" / "hello.md"
            original = "# Hello\n\nstatus: draft\n"
            r = await call_ok(session, "create_file", {"path": "notes/hello.md", "content": original})
            on_disk = target.read_bytes()
            check(on_disk == original.encode(), f"disk has {on_disk!r}")
            action = r.structured_content["actions"][0]
            check(action["after_checksum"] == sha256(on_disk), "sha256 in the result does not match the disk")
            check(target.stat().st_mode & 0o111 == 0, "the file has an execute bit")
            step("create_file", f"notes/hello.md {len(on_disk)} bytes sha256 {sha256(on_disk)[:16]}… artifact {action['artifact_id']}")

            r = await call_ok(session, "sandbox_transform", {
                "path": "notes/hello.md", "edits": [{"old": "status: draft", "new": "status: final"}]})
            transformed = "# Hello\n\nstatus: final\n"
            check(target.read_bytes() == transformed.encode(), f"disk has {target.read_bytes()!r}")
            transform_action = r.structured_content["actions"][0]["action_id"]
            step("sandbox_transform", f"draft -> final, sha256 {sha256(transformed.encode())[:16]}…")

            r = await call_ok(session, "read_file", {"path": "notes/hello.md"})
            check(text_of(r) == transformed, f"read_file text {text_of(r)!r}")
            check(r.structured_content["sha256"] == sha256(transformed.encode()), "read_file sha256 mismatch")
            check(r.structured_content["size_bytes"] == len(transformed.encode()), "read_file size mismatch")
            step("read_file", f"text equals the file, {r.structured_content['size_bytes']} bytes")

            r = await session.call_tool("create_file", {"path": "../escape.md", "content": "x"})
            check(bool(r.is_error), "an escaping path was not refused")
            check("path_traversal" in text_of(r), f"refusal text {text_of(r)!r}")
            check(not (root.parent / "escape.md").exists(), "the escape was written")
            step("refusal", "../escape.md -> isError, path_traversal")

            r = await call_ok(session, "rollback_action", {"action_id": transform_action})
            check(target.read_bytes() == original.encode(), f"after rollback_action disk has {target.read_bytes()!r}")
            step("rollback_action", f"transform {transform_action} undone, original bytes back")

            r = await call_ok(session, "rollback_workflow", {})
            check(r.structured_content["status"] == "rolled_back", f"rollback status {r.structured_content}")
            check(not target.exists(), "rollback_workflow left the created file")
            step("rollback_workflow", f"{r.structured_content['steps_rolled_back']} step(s) restored, notes/hello.md removed")

            r = await call_ok(session, "get_state", {})
            check(r.structured_content["execution_mode"] == "sandbox_write", f"state {r.structured_content}")
            step("get_state", f"mode {r.structured_content['execution_mode']}, workflow {r.structured_content['session_workflow_id']}")


def main() -> int:
    try:
        binary = find_binary()
    except StepFailed as e:
        print(f"FAIL setup: {e}", flush=True)
        return 1
    with tempfile.TemporaryDirectory(prefix="ailab-mcp-py-") as tmp:
        root = Path(tmp) / "root"
        state = Path(tmp) / "state"
        log_path = Path(tmp) / "server.log"
        with open(log_path, "w") as errlog:
            try:
                anyio.run(_with_timeout, binary, root, state, errlog)
            except BaseException as e:  # noqa: BLE001 - report any failure and exit non-zero
                detail = str(e) if isinstance(e, StepFailed) else "".join(traceback.format_exception(e))
                print(f"FAIL {detail}", flush=True)
                errlog.flush()
                log = log_path.read_text(errors="replace")
                if log:
                    print("--- server stderr ---\n" + log[-4000:], flush=True)
                return 1
    print("ok   all steps passed", flush=True)
    return 0


async def _with_timeout(binary: str, root: Path, state: Path, errlog) -> None:
    with anyio.fail_after(60):
        await session_run(binary, root, state, errlog)


if __name__ == "__main__":
    sys.exit(main())
