"""The admin site's branding (the models' admins live in their apps)."""

from __future__ import annotations

from django.contrib import admin

admin.site.site_header = "Synth operations"
admin.site.site_title = "Synth admin"
admin.site.index_title = "Runs, trials, training and the model proxy"
