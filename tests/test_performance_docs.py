"""docs/performance.md and the README's Performance section are what scripts/render_performance.py renders from
the results files in docs/results/: a figure changed in a file, or typed into a page by hand, fails the check."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "render_performance.py"


def render(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def copies(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The results folder, the page and the README copied where a test may change them."""
    results = tmp_path / "results"
    shutil.copytree(ROOT / "docs" / "results", results)
    page, readme = tmp_path / "performance.md", tmp_path / "README.md"
    shutil.copy(ROOT / "docs" / "performance.md", page)
    shutil.copy(ROOT / "README.md", readme)
    return results, page, readme


def test_the_pages_are_what_the_results_files_render():
    r = render("--check")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_performance_page_states_the_current_state_in_under_32_kb():
    """A current-state page needs no more: the story of how a figure was reached belongs in commit messages, and a
    results file that another supersedes is removed, not kept beside it."""
    size = (ROOT / "docs" / "performance.md").stat().st_size
    assert size < 32 * 1024, f"docs/performance.md is {size:,} bytes: shorten docs/results/*/why.md or retire a file"


def test_the_check_fails_on_a_changed_figure(tmp_path):
    results, page, readme = copies(tmp_path)
    path = results / "zen3-avx2" / "serving_core.json"
    data = json.loads(path.read_text())
    assert data["rows"][0][1] == "18.7"  # 1 stream's tok/s on the Zen 3
    data["rows"][0][1] = "19.7"
    data["headline"][0] = data["headline"][0].replace("4.76x", "4.86x")
    path.write_text(json.dumps(data))
    r = render("--check", "--results", str(results), "--page", str(page), "--readme", str(readme))
    assert r.returncode == 1
    assert "-| 1 stream, 64-token prompt, 64 tokens | 18.7 |" in r.stdout
    assert "+| 1 stream, 64-token prompt, 64 tokens | 19.7 |" in r.stdout
    assert "8 streams 4.86x the output tok/s" in r.stdout  # the README's headline too
    assert "run python scripts/render_performance.py" in r.stderr


def test_a_figure_typed_into_the_readme_by_hand_fails_the_check(tmp_path):
    results, page, readme = copies(tmp_path)
    text = readme.read_text()
    assert "67.3% MFU" in text
    readme.write_text(text.replace("67.3% MFU", "68.0% MFU"))
    r = render("--check", "--results", str(results), "--page", str(page), "--readme", str(readme))
    assert r.returncode == 1 and "+| NVIDIA H200" in r.stdout and "67.3% MFU" in r.stdout


def test_one_new_results_file_is_all_a_new_table_takes(tmp_path):
    """Another kind's file, with a why.md beside it: rendered into both pages, and then the check passes."""
    results, page, readme = copies(tmp_path)
    new = json.loads((results / "zen3-avx2" / "cpu_time.json").read_text())
    new |= {"kind": "zen5-avx512-bf16", "date": "2026-12-04", "commit": "abc1234", "rows": [["float32", "512", "1 ms",
            "2 ms", "2.00x", "-"]], "headline": ["a new headline"]}  # fmt: skip
    new["machine"] |= {"name": "AMD EPYC (Zen 5)", "kind": "AVX512-BF16"}
    (results / "zen5-avx512-bf16").mkdir()
    (results / "zen5-avx512-bf16" / "cpu_time.json").write_text(json.dumps(new))
    (results / "zen5-avx512-bf16" / "why.md").write_text("Kind text.\n\n## cpu_time\nWhy this table.\n")
    args = ("--results", str(results), "--page", str(page), "--readme", str(readme))
    assert render("--check", *args).returncode == 1
    wrote = render(*args)
    assert wrote.returncode == 0, wrote.stderr
    text = page.read_text()
    assert "## AMD EPYC (Zen 5), AVX512-BF16 (zen5-avx512-bf16)" in text and "| float32 | 512 | 1 ms |" in text
    assert text.index("Kind text.") < text.index("Why this table.") and "*Recorded 2026-12-04 at abc1234" in text
    assert "| AMD EPYC (Zen 5), `zen5-avx512-bf16` | Ours against transformers" in readme.read_text()
    assert (results / "zen4-avx512-bf16" / "bench.png").stat().st_size > 10_000  # the plots drawn again
    assert render("--check", *args).returncode == 0


def test_a_broken_results_file_is_one_line_not_a_traceback(tmp_path):
    results, page, readme = copies(tmp_path)
    (results / "h200" / "gpu.json").write_text("{not json")
    r = render("--check", "--results", str(results), "--page", str(page), "--readme", str(readme))
    assert r.returncode == 2 and "gpu.json: not a readable results file" in r.stderr and "Traceback" not in r.stderr
