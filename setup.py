"""Which files the distribution holds (metadata, dependencies and the console script are in
pyproject.toml). Here because pyproject.toml alone cannot both find sub-packages and map a folder
outside the package into it:

* every ``pipeline`` sub-package, found (a new one needs no edit here);
* the repository's ``static/`` installed as ``pipeline/static`` (pipeline/web/ui.py looks there
  first, then beside the package, where a checkout has it);
* ``app_sensevoice`` (``sensevoice serve``; ``python app_sensevoice.py`` keeps working in a checkout).
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["pipeline", "pipeline.*"]), "pipeline.static"],
    package_dir={"pipeline.static": "static"},
    package_data={"pipeline.static": ["*"]},
    py_modules=["app_sensevoice"],
)
