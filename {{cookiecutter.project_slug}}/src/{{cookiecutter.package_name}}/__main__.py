"""`python -m {{ cookiecutter.package_name }}` is the `{{ cookiecutter.project_slug }}` command."""

from {{ cookiecutter.package_name }}.cli import console_main

# The guard matters: DataLoader workers and DDP re-import this module.
if __name__ == "__main__":
    console_main()
