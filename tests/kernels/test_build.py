"""Building and registering the native kernels (sao.kernels.build): the cache, its key, and every failure named."""
import logging
import os
import shutil

import pytest

from sao.kernels import build

_HAS_COMPILER = shutil.which(os.environ.get("CXX", "c++").split()[0]) is not None


@pytest.fixture
def sources(tmp_path, monkeypatch):
  """A source directory of our own and an empty cache, with the process's loaded kernels out of the way."""
  source_dir = tmp_path / "src"
  source_dir.mkdir()
  shutil.copy(os.path.join(os.path.dirname(build.__file__), "gae_cpu.cc"), source_dir / "gae_cpu.cc")
  monkeypatch.setattr(build, "_SOURCE_DIR", str(source_dir))
  monkeypatch.setenv("SAO_CACHE_DIR", str(tmp_path / "cache"))
  monkeypatch.setattr(build, "_loaded", {})
  monkeypatch.setattr(build, "_warned", set())
  return source_dir


def test_mode_reads_the_variable_and_names_it_when_wrong():
  assert build.mode({}) == build.AUTO
  assert build.mode({build.ENV: " Off "}) == build.OFF
  assert build.mode({build.ENV: "on"}) == build.ON
  with pytest.raises(ValueError, match="SAO_NATIVE_KERNELS='sometimes'"):
    build.mode({build.ENV: "sometimes"})


def test_cache_dir_follows_sao_cache_dir(monkeypatch, tmp_path):
  monkeypatch.setenv("SAO_CACHE_DIR", str(tmp_path))
  assert build.cache_dir() == str(tmp_path / "kernels")
  monkeypatch.delenv("SAO_CACHE_DIR")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert build.cache_dir() == str(tmp_path / "xdg" / "sao" / "kernels")


@pytest.mark.skipif(not _HAS_COMPILER, reason="no C++ compiler on this host")
def test_a_build_is_cached_and_a_changed_source_is_a_new_one(sources):
  first = build.library_path("gae_cpu")
  assert os.path.dirname(first) == build.cache_dir() and os.path.exists(first)
  built_at = os.stat(first).st_mtime_ns
  assert build.library_path("gae_cpu") == first and os.stat(first).st_mtime_ns == built_at  # not rebuilt
  with open(sources / "gae_cpu.cc", "a") as f:
    f.write("// changed\n")
  second = build.library_path("gae_cpu")
  assert second != first and os.path.exists(second)
  assert sorted(os.listdir(build.cache_dir())) == sorted(os.path.basename(p) for p in (first, second))


@pytest.mark.skipif(not _HAS_COMPILER, reason="no C++ compiler on this host")
def test_a_failed_build_names_the_command_and_the_error_and_leaves_nothing(sources):
  (sources / "broken.cc").write_text("this is not C++\n")
  with pytest.raises(build.BuildError, match=r"(?s)building the native kernel 'broken' failed.*broken\.cc.*error"):
    build.library_path("broken")
  assert os.listdir(build.cache_dir()) == []  # no partial library


def test_a_missing_compiler_is_named(sources, monkeypatch):
  monkeypatch.setenv("CXX", "/nonexistent/c++")
  with pytest.raises(build.BuildError, match="no C\\+\\+ compiler: '/nonexistent/c\\+\\+' not found"):
    build.library_path("gae_cpu")


def test_available_follows_the_mode(sources, monkeypatch, caplog):
  (sources / "broken.cc").write_text("this is not C++\n")
  targets = {"sao_test_broken": "Broken"}
  monkeypatch.setenv(build.ENV, "off")
  assert not build.available("broken", targets)
  assert not os.path.exists(build.cache_dir())  # off never builds
  monkeypatch.setenv(build.ENV, "auto")
  with caplog.at_level(logging.WARNING):
    assert not build.available("broken", targets)
    assert not build.available("broken", targets)
  warnings = [r for r in caplog.records if "native kernel 'broken' unavailable" in r.getMessage()]
  assert len(warnings) == 1  # once per process
  monkeypatch.setenv(build.ENV, "on")
  with pytest.raises(build.BuildError):
    build.available("broken", targets)


@pytest.mark.skipif(not _HAS_COMPILER, reason="no C++ compiler on this host")
def test_a_missing_symbol_is_a_build_error(sources):
  with pytest.raises(build.BuildError, match="loading the native kernel 'gae_cpu'.*NoSuchHandler"):
    build.load("gae_cpu", {"sao_test_missing": "NoSuchHandler"})
