"""Bulk node import from CSV and YAML: all or nothing, every error with its line."""

from __future__ import annotations

import textwrap

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from inventory import services
from inventory.importers import COLUMNS, NodeImportError, nodes_import
from inventory.models import Credential, Node, Site

pytestmark = pytest.mark.django_db


@pytest.fixture
def credential() -> Credential:
    key = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    return services.credential_create(name="ops-key", username="ops", private_key=key.decode())


def errors_of(text: str, fmt: str) -> list[tuple[int, str]]:
    with pytest.raises(NodeImportError) as caught:
        nodes_import(text=textwrap.dedent(text), fmt=fmt)
    assert Node.objects.count() == 0, "a refused import must create nothing"
    return caught.value.errors


def test_it_creates_nodes_from_csv_with_site_tags_and_credential(credential: Credential) -> None:
    text = textwrap.dedent(
        """\
        name,address,ssh_port,ssh_user,credential,role,status,site,tags,gpu_model,gpu_count,gpu_memory_mb,cpu_cores,ram_mb
        gpu01,10.0.0.11,2222,bench,ops-key,compute,active,dc1,a100;rack-1,NVIDIA A100-SXM4-80GB,8,81920,64,1031000
        login1,10.0.0.2,,,,login,maintenance,dc1,,,,,,
        """
    )
    nodes = nodes_import(text=text, fmt="csv")

    assert [n.name for n in nodes] == ["gpu01", "login1"]
    gpu01 = Node.objects.get(name="gpu01")
    assert (gpu01.address, gpu01.ssh_port, gpu01.ssh_user, gpu01.credential) == ("10.0.0.11", 2222, "bench", credential)
    assert (gpu01.gpu_model, gpu01.gpu_count, gpu01.gpu_memory_mb) == ("NVIDIA A100-SXM4-80GB", 8, 81920)
    assert (gpu01.cpu_cores, gpu01.ram_mb, gpu01.site.name) == (64, 1031000, "dc1")
    assert sorted(gpu01.tags.values_list("name", flat=True)) == ["a100", "rack-1"]
    login1 = Node.objects.get(name="login1")
    assert (login1.role, login1.status, login1.ssh_port, login1.credential) == ("login", "maintenance", 22, None)
    assert Site.objects.count() == 1


def test_it_updates_an_existing_node_and_leaves_fields_the_file_does_not_give() -> None:
    services.node_upsert(name="gpu01", address="10.0.0.1", gpu_model="NVIDIA H100 80GB HBM3", gpu_count=8, tags=["old"])

    nodes_import(text="name,address,ssh_port,gpu_count,tags\ngpu01,10.0.0.99,2200,,\n", fmt="csv")

    node = Node.objects.get(name="gpu01")
    assert (node.address, node.ssh_port) == ("10.0.0.99", 2200)
    assert (node.gpu_model, node.gpu_count) == ("NVIDIA H100 80GB HBM3", 8)
    assert list(node.tags.values_list("name", flat=True)) == ["old"]
    assert Node.objects.count() == 1


def test_it_reports_every_csv_error_with_its_file_line(credential: Credential) -> None:
    errors = errors_of(
        """\
        name,address,ssh_port,credential,role,status
        gpu01,10.0.0.11,22,ops-key,compute,active
        ,10.0.0.12,22,,,
        gpu03,,22,,,
        gpu04,10.0.0.14,ssh,,,
        gpu05,10.0.0.15,70000,,,
        gpu06,10.0.0.16,22,nobody-key,,
        gpu07,10.0.0.17,22,,gpu-box,
        gpu08,10.0.0.18,22,,,broken
        gpu01,10.0.0.19,22,,,
        """,
        "csv",
    )
    assert errors == [
        (3, "name is missing"),
        (4, "address is missing"),
        (5, "ssh_port 'ssh' is not a TCP port (1-65535)"),
        (6, "ssh_port '70000' is not a TCP port (1-65535)"),
        (7, "credential 'nobody-key' does not exist; create it first (admin: Credentials)"),
        (8, "role 'gpu-box' is not one of: compute, storage-client, login, other"),
        (9, "status 'broken' is not one of: active, maintenance, retired"),
        (10, "node 'gpu01' is already on line 2"),
    ]


def test_it_refuses_unknown_and_missing_columns_on_the_header_line() -> None:
    errors = errors_of("\nname,adress,gpus\nn1,10.0.0.1,8\n", "csv")
    assert [line for line, _ in errors] == [2, 2, 2]
    messages = " | ".join(message for _, message in errors)
    assert "unknown column 'adress'" in messages
    assert "unknown column 'gpus'" in messages
    assert "column 'address' is missing" in messages


def test_it_counts_lines_of_quoted_multiline_fields_and_blank_lines() -> None:
    text = 'name,address,cpu_model\n\nn1,10.0.0.1,"Intel\nXeon"\n\nn2,10.0.0.2,x,extra\n'
    errors = errors_of(text, "csv")
    assert errors == [(6, "4 fields where the header has 3")]


def test_it_rejects_bad_numbers_and_tags() -> None:
    errors = errors_of("name,address,gpu_count,ram_mb,tags\nn1,10.0.0.1,-1,lots,ok;not ok\n", "csv")
    assert errors == [
        (2, "gpu_count '-1' is not a whole number >= 0"),
        (2, "ram_mb 'lots' is not a whole number >= 0"),
        (2, "tag 'not ok' may hold only letters, digits, '-' and '_'"),
    ]


def test_it_creates_nodes_from_yaml(credential: Credential) -> None:
    text = textwrap.dedent(
        """\
        # two nodes
        - name: gpu01
          address: 10.0.0.11
          credential: ops-key
          site: dc2
          tags: [h100, rack-2]
          gpu_model: NVIDIA H100 80GB HBM3
          gpu_count: 8
        - {name: gpu02, address: 10.0.0.12, ssh_port: "2222"}
        """
    )
    nodes_import(text=text, fmt="yaml")

    gpu01 = Node.objects.get(name="gpu01")
    assert (gpu01.credential, gpu01.site.name, gpu01.gpu_count) == (credential, "dc2", 8)
    assert sorted(gpu01.tags.values_list("name", flat=True)) == ["h100", "rack-2"]
    assert Node.objects.get(name="gpu02").ssh_port == 2222


def test_it_accepts_a_yaml_mapping_with_a_nodes_list() -> None:
    nodes_import(text="nodes:\n  - name: n1\n    address: 10.0.0.1\n", fmt="yaml")
    assert Node.objects.filter(name="n1").exists()


def test_it_reports_yaml_errors_on_the_line_of_each_item() -> None:
    errors = errors_of(
        """\
        nodes:
          - name: ok1
            address: 10.0.0.1
          - name: bad-port
            address: 10.0.0.2
            ssh_port: 0
          - address: 10.0.0.3
            role: compute
          - name: typo
            adress: 10.0.0.4
          - just a string
          - name: ok1
            address: 10.0.0.5
            status: gone
            ssh_port: true
        """,
        "yaml",
    )
    assert errors == [
        (4, "ssh_port 0 is not a TCP port (1-65535)"),
        (7, "name is missing"),
        (9, "address is missing"),
        (9, "unknown key 'adress'; the keys are: " + ", ".join(COLUMNS)),
        (11, "each node must be a mapping of field: value"),
        (12, "node 'ok1' is already on line 2"),
        (12, "ssh_port True is not a TCP port (1-65535)"),
        (12, "status 'gone' is not one of: active, maintenance, retired"),
    ]


def test_it_reports_the_line_of_a_yaml_syntax_error() -> None:
    errors = errors_of("- name: n1\n  address: 10.0.0.1\n- name: [n2\n  address: 10.0.0.2\n", "yaml")
    assert len(errors) == 1
    assert errors[0][0] == 4
    assert errors[0][1].startswith("not valid YAML")


def test_it_refuses_yaml_that_is_not_a_list_of_nodes_and_empty_files() -> None:
    assert errors_of("name: n1\naddress: 10.0.0.1\n", "yaml") == [
        (1, "expected a list of nodes, or a mapping with a 'nodes' list")
    ]
    assert errors_of("", "yaml") == [(1, "no nodes in the file")]
    assert errors_of("name,address\n", "csv") == [(1, "no nodes in the file")]


def test_it_creates_nothing_when_one_row_of_many_is_bad() -> None:
    rows = "".join(f"n{i},10.0.0.{i},{'x' if i == 7 else 22}\n" for i in range(1, 50))
    assert errors_of("name,address,ssh_port\n" + rows, "csv") == [(8, "ssh_port 'x' is not a TCP port (1-65535)")]
