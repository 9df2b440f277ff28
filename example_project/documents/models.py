from django.db import models


class Document(models.Model):
    """An uploaded document, its conversion and its preview. Times are epoch seconds."""

    customer = models.SlugField(max_length=100, db_index=True)
    name = models.CharField(max_length=200)
    content = models.TextField()
    uploaded_at = models.FloatField()

    conversion_started_at = models.FloatField(null=True)
    converted_at = models.FloatField(null=True)
    converted = models.TextField(blank=True)

    preview_requested_at = models.FloatField(null=True)
    preview_rendered_at = models.FloatField(null=True)
    preview = models.TextField(blank=True)
    preview_ran_as = models.CharField(max_length=250, blank=True)  # class and group

    class Meta:
        ordering = ["id"]

    def as_dict(self):
        return {f.name: getattr(self, f.name) for f in self._meta.fields
                if f.name not in ("content", "converted", "preview")}
