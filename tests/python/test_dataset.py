"""Data set scanning: ImageFolder order as torchvision gives it, and list files."""

import os
import shutil

import pytest
import torchvision
from PIL import Image

import feedline
import util


def test_imagefolder_matches_torchvision(image_folder):
    tv = torchvision.datasets.ImageFolder(image_folder)
    loader = feedline.ImageLoader(image_folder, batch_size=8)
    assert loader.classes == tv.classes
    assert loader.class_to_idx == tv.class_to_idx
    assert [tuple(s) for s in loader.samples] == [tuple(s) for s in tv.samples]
    assert loader.targets == tv.targets
    assert loader.num_samples == len(tv.samples)


def test_imagefolder_details(image_folder):
    """The cases that make test_imagefolder_matches_torchvision meaningful are really there."""
    loader = feedline.ImageLoader(image_folder, batch_size=8)
    rel = [os.path.relpath(p, image_folder) for p, _ in loader.samples]
    assert loader.classes == ["Dog", "bird", "cat", "fish"]
    # mixed-case extensions are accepted
    for name in ("Dog/gray_2.JPG", "bird/mixed.Jpeg", "bird/upper.JPEG", "cat/png_inside.JPEG",
                 "cat/real.png"):
        assert name in rel
    # non-images are ignored
    assert not any(p.endswith((".txt", ".csv")) or "README" in p for p in rel)
    # torchvision's walk order: sorted(os.walk()) puts "cat/sub-2" before "cat/sub/deeper"
    cat = [r for r in rel if r.startswith("cat/sub")]
    assert cat == ["cat/sub/a.jpg", "cat/sub/b.jpeg", "cat/sub-2/c.jpg",
                   "cat/sub/deeper/d.jpg", "cat/sub/deeper/e.jpg"]
    # string order of file names, not numeric ("img_10" < "img_2")
    dog = [r for r in rel if r.startswith("Dog/img_")]
    assert dog.index("Dog/img_10.jpg") < dog.index("Dog/img_2.jpg")
    # paths are the source joined with the relative path, as torchvision gives them
    assert all(p.startswith(image_folder + os.sep) for p, _ in loader.samples)


def test_source_accepts_pathlike(image_folder):
    import pathlib
    a = feedline.ImageLoader(pathlib.Path(image_folder), batch_size=8)
    b = feedline.ImageLoader(image_folder, batch_size=8)
    assert a.samples == b.samples


def _make_list_dataset(tmp_path, small_folder):
    """Copies a few images under tmp_path/data/imgs and writes tmp_path/data/list.txt."""
    data = tmp_path / "data"
    (data / "imgs" / "deep").mkdir(parents=True)
    srcs = sorted(os.path.join(small_folder, "x", f) for f in os.listdir(
        os.path.join(small_folder, "x")))
    rels = ["imgs/a.jpg", "imgs/with space.jpg", "imgs/deep/b.jpg", "imgs/c.jpg", "imgs/d.jpg"]
    labels = [7, 2, 0, 7, 5]
    for src, rel in zip(srcs, rels):
        shutil.copyfile(src, data / rel)
    lines = ["# a comment", ""]
    lines += [f"{rel} {label}" for rel, label in zip(rels, labels)]
    lines += ["", "# trailing comment"]
    listfile = data / "list.txt"
    listfile.write_text("\n".join(lines) + "\n")
    return str(listfile), rels, labels


def test_list_file_samples(tmp_path, small_folder):
    listfile, rels, labels = _make_list_dataset(tmp_path, small_folder)
    loader = feedline.ImageLoader(listfile, batch_size=2, return_index=True, transform="eval",
                                  size=32, resize_size=40)
    folder = os.path.dirname(listfile)
    assert [tuple(s) for s in loader.samples] == [
        (os.path.join(folder, r), lab) for r, lab in zip(rels, labels)]
    assert loader.classes == []
    assert loader.num_samples == len(rels)
    assert len(loader) == 3
    seen = []
    for images, y, idx in loader:
        assert images.shape[1:] == (3, 32, 32)
        for label, i in zip(y.tolist(), idx.tolist()):
            assert label == labels[i]
            seen.append(i)
    assert sorted(seen) == list(range(len(rels)))


def test_list_file_from_another_cwd(tmp_path, small_folder, monkeypatch):
    """Paths in a list file are relative to the list file's folder, not to the cwd."""
    listfile, rels, labels = _make_list_dataset(tmp_path, small_folder)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loader = feedline.ImageLoader(listfile, batch_size=5, shuffle=False, size=32)
    images, y = next(iter(loader))
    assert y.tolist() == labels


def test_list_file_malformed_line(tmp_path, small_folder):
    data = tmp_path / "bad"
    data.mkdir()
    shutil.copyfile(os.path.join(small_folder, "x", "00.jpg"), data / "a.jpg")
    listfile = data / "list.txt"
    listfile.write_text("a.jpg 1\na.jpg notalabel\n")
    with pytest.raises(ValueError) as e:
        feedline.ImageLoader(str(listfile), batch_size=2)
    assert "list.txt" in str(e.value)


def test_class_without_images_is_an_error(tmp_path, small_folder):
    """torchvision refuses a class folder without images; so does feedline."""
    root = tmp_path / "ds"
    shutil.copytree(small_folder, root)
    (root / "empty_class").mkdir()
    (root / "empty_class" / "notes.txt").write_text("no images here\n")
    with pytest.raises(FileNotFoundError):
        torchvision.datasets.ImageFolder(str(root))
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        feedline.ImageLoader(str(root), batch_size=2)
    assert "empty_class" in str(e.value)


def test_empty_directory_is_an_error(tmp_path):
    with pytest.raises((ValueError, FileNotFoundError)):
        feedline.ImageLoader(str(tmp_path), batch_size=2)


@pytest.fixture(scope="module")
def edge_folder(tmp_path_factory):
    """Names and links that a scanner can get wrong: a hidden file, non-ASCII names, a folder
    named like an image, symlinked folders and files (torchvision follows links), an image next
    to the class folders, a class folder that is a symlink."""
    root = tmp_path_factory.mktemp("edges")

    def img(rel, seed=0):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(util.photo_like(120, 90, seed)).save(str(path), format="JPEG",
                                                              quality=85)

    for rel in ("a/1.jpg", "a/.hidden.jpg", "a/café.jpg", "a/日本.jpg", "a/Z.jpg",
                "a/UPPER.JPG", "a/x.webp.jpg", "a/folder.jpg/inner.jpg", "b/x.jpeg",
                "top.jpg", "other/o1.jpg", "other/o2.jpg"):
        img(rel)
    (root / "a" / "archive.jpg.bak").write_text("not an image")
    os.symlink(str(root / "other"), str(root / "b" / "linked"))
    os.symlink(str(root / "a" / "1.jpg"), str(root / "b" / "link_file.jpg"))
    os.symlink(str(root / "other"), str(root / "c_link"))
    return str(root)


def test_edge_names_match_torchvision(edge_folder):
    tv = torchvision.datasets.ImageFolder(edge_folder)
    loader = feedline.ImageLoader(edge_folder, batch_size=4, size=32, return_index=True)
    assert loader.classes == tv.classes
    assert [tuple(s) for s in loader.samples] == [tuple(s) for s in tv.samples]
    n = 0
    for x, y, idx in loader:  # and every one of them loads
        n += int(x.shape[0])
    assert n == len(tv.samples)


@pytest.mark.parametrize("form", ["relative", "trailing_slash"])
def test_source_spelling_matches_torchvision(edge_folder, form, monkeypatch):
    parent, name = os.path.split(edge_folder)
    monkeypatch.chdir(parent)
    source = name if form == "relative" else edge_folder + os.sep
    tv = torchvision.datasets.ImageFolder(source)
    loader = feedline.ImageLoader(source, batch_size=4)
    assert [tuple(s) for s in loader.samples] == [tuple(s) for s in tv.samples]
