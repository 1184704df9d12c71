{{ cookiecutter.project_name | py_string }}

__version__ = "0.1.0"
