"""Holds only ms-swift's ``--external_plugins`` file (see impl.integrations.swift): ms-swift puts
the plugin's folder on sys.path, so nothing else may live here."""
