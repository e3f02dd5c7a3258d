"""Checks the completion table in the real TensorBoard UI, in a real browser.

    pip install -r benchmarks/requirements.txt        # playwright (its own browser download is not needed)
    apt-get install chromium                          # the browser it drives (executable_path)
    python benchmarks/ui/completion_table_ui.py [--chromium /usr/bin/chromium] [--out table.png]

Trains two tiny agents for two batches with ``CompletionLogger(every_n_steps=1)`` and logs, beside
it, the same table (:func:`completion_report`) for a step whose agent wrote :data:`CODE` (a Python
function of 38 lines, most of them ~95 characters long); starts ``tensorboard`` on the log folder,
opens its TEXT tab in headless Chromium and measures the rendered tables: the header cells, the
rows and the width against the text card; for the code cell, its font (monospace: ``i`` as wide as
``W``), its text (all of it, indentation kept), its width in characters against the longest line
and its height in lines against the line count (no wrapping). Prints the numbers, writes a
screenshot, and exits 1 when a table is missing, lacks a column or is narrower than 90 % of its
card, or the code is cut, wrapped or not monospace.
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
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run"]  # fmt: skip
CODE = (
    "def solve_the_task(numbers: list[int], threshold: int = 10) -> dict[str, list[int]]:\n"
    + "".join(
        f"    bucket_{i} = [n for n in numbers if n % {i + 2} == 0 and n > threshold]  # keep the multiples of {i + 2}\n"
        for i in range(36)
    )
    + "    return {'__all__': [*numbers], 'kept': bucket_0 + bucket_1}\n"
)
"""A code completion as the coding task's agents write it: long lines, indentation, ``__dunder__``."""


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
    import torch

    from comlrl_lightning.callbacks.completion_logger import completion_report

    code_step = {"prompts": [["Write solve_the_task."], ["Write its helper."]], "completions": [[CODE], ["pass"]],
                 "turn0_rewards": torch.tensor([[1.0]]), "num_generations": 1}  # fmt: skip
    logger.experiment.add_text("code_completion", completion_report(code_step, 4, None), global_step=0)
    logger.experiment.flush()
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(url: str, chromium: str, screenshot: str) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
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
        pre = page.locator("pre", has_text="def solve_the_task").first
        pre.wait_for(timeout=60_000)
        pre.scroll_into_view_if_needed()
        numbers["code"] = pre.evaluate(
            """el => {
                const cs = getComputedStyle(el), ctx = document.createElement('canvas').getContext('2d');
                ctx.font = `${cs.fontSize} ${cs.fontFamily}`;
                const box = el.getBoundingClientRect();
                return {font: cs.fontFamily, white_space: cs.whiteSpace, text: el.innerText,
                        monospace: Math.abs(ctx.measureText('i').width - ctx.measureText('W').width) < 0.01,
                        char_px: ctx.measureText('0').width, line_px: parseFloat(cs.lineHeight) || 1.2 * parseFloat(cs.fontSize),
                        width_px: Math.max(box.width, el.scrollWidth), height_px: box.height};
            }"""
        )
        page.screenshot(path=screenshot, full_page=True)
        pre.screenshot(path=screenshot.replace(".png", "_code.png"))
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
    c, lines = m["code"], CODE.rstrip("\n").split("\n")
    chars, shown_lines = c["width_px"] / c["char_px"], c["height_px"] / c["line_px"]
    full = c["text"].rstrip("\n") == CODE.rstrip("\n")
    print(f"code cell: font {c['font']!r} (monospace {c['monospace']}), white-space {c['white_space']}, full text "
          f"{full}; {chars:.0f} characters wide for a longest line of {max(map(len, lines))}; "
          f"{shown_lines:.1f} lines tall for {len(lines)} lines; load {os.getloadavg()[0]:.1f}")  # fmt: skip
    ok = m["headers"] == COLUMNS and m["rows"] > 0 and ratio >= 0.9
    ok = ok and c["monospace"] and full and chars >= max(map(len, lines)) and shown_lines < len(lines) + 1.5
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
