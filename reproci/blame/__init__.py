"""Upgrade blame (``--blame``, ``reproci blame``): which changed package alone moves the results.

``images`` builds the environments (the golden's image with one package group of the new image
laid in); ``stages/blame/`` runs the affected models in them and compares with the golden.
"""
