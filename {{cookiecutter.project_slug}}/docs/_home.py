"""MkDocs hook (mkdocs.yml): the project's README.md is the site's home page, its
links to docs/<page>.md made links to the pages beside it."""

from pathlib import Path

from mkdocs.structure.files import File


def on_files(files, config):
    readme = Path(config.config_file_path).parent / "README.md"
    text = readme.read_text(encoding="utf-8").replace("](docs/", "](")
    files.append(File.generated(config, "index.md", content=text))
    return files
