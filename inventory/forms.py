"""Forms of the inventory admin: credentials (write-only private key) and the bulk node import."""

from __future__ import annotations

from typing import Any

from django import forms

from inventory import services
from inventory.models import Credential

MAX_IMPORT_BYTES = 5 * 2**20


class WriteOnlyTextarea(forms.Textarea):
    """A textarea that never renders a value, not even the one just posted with a form that had errors."""

    def format_value(self, value: Any) -> None:
        return None


class CredentialForm(forms.ModelForm):
    private_key = forms.CharField(
        required=False,
        strip=False,
        widget=WriteOnlyTextarea(attrs={"rows": 8, "cols": 70, "autocomplete": "off", "spellcheck": "false"}),
        help_text=(
            "OpenSSH or PEM private key (ed25519, ECDSA or RSA) without a passphrase. It is stored encrypted and "
            "never shown again. When changing a credential, leave this empty to keep the current key."
        ),
    )

    class Meta:
        model = Credential
        fields = ["name", "username"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["private_key"].required = self.instance.pk is None

    def clean_private_key(self) -> str:
        key = self.cleaned_data["private_key"]
        if key.strip():
            try:
                services.credential_key_check(private_key=key)
            except services.InventoryError as exc:
                raise forms.ValidationError(exc.message) from None
        return key


class NodeImportForm(forms.Form):
    fmt = forms.ChoiceField(label="Format", choices=[("csv", "CSV"), ("yaml", "YAML")], initial="csv")
    file = forms.FileField(required=False, help_text="a .csv or .yaml file, UTF-8")
    text = forms.CharField(
        required=False,
        strip=False,
        label="or paste",
        widget=forms.Textarea(attrs={"rows": 12, "cols": 100, "spellcheck": "false"}),
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        upload, text = data.get("file"), data.get("text") or ""
        if upload and text.strip():
            raise forms.ValidationError("Give either a file or pasted text, not both.")
        if upload:
            if upload.size > MAX_IMPORT_BYTES:
                raise forms.ValidationError(f"The file is larger than {MAX_IMPORT_BYTES // 2**20} MiB.")
            try:
                data["content"] = upload.read().decode("utf-8-sig")
            except UnicodeDecodeError:
                raise forms.ValidationError("The file is not UTF-8 text.") from None
        elif text.strip():
            data["content"] = text
        else:
            raise forms.ValidationError("Choose a file or paste the nodes.")
        return data
