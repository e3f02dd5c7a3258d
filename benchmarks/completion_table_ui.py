"""Checks the completion table in the real TensorBoard UI, in a real browser.

    pip install -r benchmarks/requirements.txt        # playwright (its own browser download is not needed)
    apt-get install chromium                          # the browser it drives (executable_path)
    python benchmarks/completion_table_ui.py [--chromium /usr/bin/chromium] [--out table.png]

Trains two tiny agents for two batches with ``CompletionLogger(every_n_steps=1)``, starts
``tensorboard`` on the log folder, opens its TEXT tab in headless Chromium and measures the rendered
table: its header cells, its rows, and its width against the text card that holds it. Prints the
numbers, writes a screenshot, and exits 1 when the table is not there, lacks a column, or is
narrower than 90 % of its card.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time

COLUMNS = ["episode", "joint action", "turn", "agent", "prompt", "completion", "reward"]


def write_logs(root: str) -> str:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger

    from comlrl_lightning import MAGRPO
    from comlrl_lightning.callbacks import CompletionLogger
    from comlrl_lightning.datamodules import LengthRatioDataModule

    pl.seed_everything(0)
    model = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, num_generations=2, max_new_tokens=96)
    logger = TensorBoardLogger(root, name="ui")
    trainer = pl.Trainer(accelerator="cpu", max_steps=MAGRPO.max_steps_for(2, 2), logger=logger,
                         callbacks=[CompletionLogger(every_n_steps=1, max_rows=4)], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=4))
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(url: str, chromium: str, screenshot: str) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_selector("table th", timeout=60_000)  # Playwright's selectors pierce the shadow DOM
        table = page.locator("table").first
        numbers = table.evaluate(
            """t => {
                const card = t.closest('.tf-text-card, tf-text-loader, .card') || t.parentElement;
                const cardBox = (card.getRootNode().host && !t.closest('.card') ? card.getRootNode().host : card)
                    .getBoundingClientRect();
                return {headers: [...t.querySelectorAll('th')].map(h => h.textContent.trim()),
                        rows: t.querySelectorAll('tbody tr').length,
                        table_px: t.getBoundingClientRect().width, card_px: cardBox.width,
                        viewport_px: window.innerWidth};
            }"""
        )
        page.screenshot(path=screenshot, full_page=True)
        browser.close()
    return numbers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--out", default="completion_table.png", help="screenshot path")
    args = ap.parse_args(argv)
    root = write_logs(tempfile.mkdtemp(prefix="completion-ui-"))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", root, "--port", str(port),
                               "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(120):  # up to 60 s for the server
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.5)
        m = measure(f"http://127.0.0.1:{port}/#text", args.chromium, args.out)
    finally:
        server.terminate()
        server.wait(timeout=30)
    ratio = m["table_px"] / m["card_px"] if m["card_px"] else 0.0
    print(f"headers {m['headers']}; {m['rows']} rows; table {m['table_px']:.0f} px of a {m['card_px']:.0f} px "
          f"card ({ratio:.2f}), viewport {m['viewport_px']} px; screenshot {args.out}")  # fmt: skip
    ok = m["headers"] == COLUMNS and m["rows"] > 0 and ratio >= 0.9
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
