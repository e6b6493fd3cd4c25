"""The one release runner shared by TopDown, group sizes and synth (``runner``: output, lock,
secret policy, resume, clock), the manifest's common fields (``manifest``), the command
line's shared flags (``flags``) and the error-by-level figure of ``--evaluate``
(``error_plot``)."""
