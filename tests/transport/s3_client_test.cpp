#include "transport/s3_client.hpp"

#include <gtest/gtest.h>

#include <string>

using namespace stitch;
using namespace stitch::transport;

namespace {

// AWS's published examples ("Signature Calculations for the Authorization
// Header: Transferring Payload in a Single Chunk", Amazon S3 API reference).
const s3_credentials example_credentials{"AKIAIOSFODNN7EXAMPLE",
                                         "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
constexpr std::string_view example_host = "examplebucket.s3.amazonaws.com";
constexpr std::string_view example_date = "20130524T000000Z";

} // namespace

TEST(sigv4, get_object_with_range_matches_the_aws_example) {
  sigv4_request req;
  req.method = "GET";
  req.path = "/test.txt";
  req.headers = {{"Host", std::string{example_host}},
                 {"Range", "bytes=0-9"},
                 {"x-amz-content-sha256", std::string{empty_payload_sha256}},
                 {"x-amz-date", std::string{example_date}}};
  req.payload_sha256 = empty_payload_sha256;
  req.amz_date = example_date;
  req.region = "us-east-1";
  auto sig = sigv4_sign(req, example_credentials);
  EXPECT_EQ(sig.canonical_request, "GET\n"
                                   "/test.txt\n"
                                   "\n"
                                   "host:examplebucket.s3.amazonaws.com\n"
                                   "range:bytes=0-9\n"
                                   "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e46"
                                   "49b934ca495991b7852b855\n"
                                   "x-amz-date:20130524T000000Z\n"
                                   "\n"
                                   "host;range;x-amz-content-sha256;x-amz-date\n"
                                   "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b8"
                                   "55");
  EXPECT_EQ(sig.string_to_sign, "AWS4-HMAC-SHA256\n"
                                "20130524T000000Z\n"
                                "20130524/us-east-1/s3/aws4_request\n"
                                "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(sig.signature, "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  EXPECT_EQ(sig.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(sigv4, put_object_matches_the_aws_example) {
  const std::string body = "Welcome to Amazon S3.";
  const std::string payload = sha256_hex(body);
  EXPECT_EQ(payload, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  sigv4_request req;
  req.method = "PUT";
  // '$' is encoded by the signer: the canonical URI is /test%24file.text.
  req.path = "/test$file.text";
  req.headers = {{"Host", std::string{example_host}},
                 {"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                 {"x-amz-date", std::string{example_date}},
                 {"x-amz-storage-class", "REDUCED_REDUNDANCY"},
                 {"x-amz-content-sha256", payload}};
  req.payload_sha256 = payload;
  req.amz_date = example_date;
  req.region = "us-east-1";
  auto sig = sigv4_sign(req, example_credentials);
  EXPECT_EQ(sig.canonical_request,
            "PUT\n"
            "/test%24file.text\n"
            "\n"
            "date:Fri, 24 May 2013 00:00:00 GMT\n"
            "host:examplebucket.s3.amazonaws.com\n"
            "x-amz-content-sha256:"
              + payload
              + "\n"
                "x-amz-date:20130524T000000Z\n"
                "x-amz-storage-class:REDUCED_REDUNDANCY\n"
                "\n"
                "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class\n"
              + payload);
  EXPECT_EQ(sig.string_to_sign, "AWS4-HMAC-SHA256\n"
                                "20130524T000000Z\n"
                                "20130524/us-east-1/s3/aws4_request\n"
                                "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d");
  EXPECT_EQ(sig.signature, "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(sigv4, list_objects_matches_the_aws_example_with_the_query_sorted) {
  sigv4_request req;
  req.method = "GET";
  req.path = "/";
  req.query = {{"prefix", "J"}, {"max-keys", "2"}};
  req.headers = {{"Host", std::string{example_host}},
                 {"x-amz-date", std::string{example_date}},
                 {"x-amz-content-sha256", std::string{empty_payload_sha256}}};
  req.payload_sha256 = empty_payload_sha256;
  req.amz_date = example_date;
  req.region = "us-east-1";
  auto sig = sigv4_sign(req, example_credentials);
  EXPECT_EQ(sig.canonical_request, "GET\n"
                                   "/\n"
                                   "max-keys=2&prefix=J\n"
                                   "host:examplebucket.s3.amazonaws.com\n"
                                   "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e46"
                                   "49b934ca495991b7852b855\n"
                                   "x-amz-date:20130524T000000Z\n"
                                   "\n"
                                   "host;x-amz-content-sha256;x-amz-date\n"
                                   "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b8"
                                   "55");
  EXPECT_EQ(sig.string_to_sign, "AWS4-HMAC-SHA256\n"
                                "20130524T000000Z\n"
                                "20130524/us-east-1/s3/aws4_request\n"
                                "df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b7");
  EXPECT_EQ(sig.signature, "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST(sigv4, bare_subresources_sign_with_an_empty_value_and_header_values_are_trimmed) {
  sigv4_request req;
  req.method = "GET";
  req.path = "/";
  req.query = {{"lifecycle", ""}};
  req.headers = {{"Host", std::string{example_host}},
                 {"x-amz-date", "  20130524T000000Z  "},
                 {"x-amz-content-sha256", std::string{empty_payload_sha256}}};
  req.payload_sha256 = empty_payload_sha256;
  req.amz_date = example_date;
  req.region = "us-east-1";
  auto sig = sigv4_sign(req, example_credentials);
  EXPECT_NE(sig.canonical_request.find("\nlifecycle=\n"), std::string::npos);
  EXPECT_EQ(sig.signature, "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST(sigv4, uri_encoding_keeps_only_unreserved_bytes) {
  EXPECT_EQ(uri_encode("a-b_c.d~e", true), "a-b_c.d~e");
  EXPECT_EQ(uri_encode("a b/c+d=\xc3\xa9", false), "a%20b%2Fc%2Bd%3D%C3%A9");
  EXPECT_EQ(uri_encode("pool/run 1/weight_v000001", true), "pool/run%201/weight_v000001");
}

TEST(s3_uri, parses_bucket_and_prefix) {
  auto loc = parse_s3_uri("s3://my-bucket/some/prefix/");
  ASSERT_TRUE(loc) << to_string(loc.error());
  EXPECT_EQ(loc->bucket, "my-bucket");
  EXPECT_EQ(loc->prefix, "some/prefix");
  auto bare = parse_s3_uri("s3://bucket.name");
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare->prefix, "");
  EXPECT_EQ(parse_s3_uri("s3://bucket/")->prefix, "");
}

TEST(s3_uri, refuses_malformed_uris_naming_them) {
  for (std::string_view bad :
       {"bucket/prefix", "s3://", "s3://ab", "s3://Bucket/x", "s3://bucket_x/x", "s3://-bucket",
        "s3://bucket/a//b", "s3://bucket/../x", "s3://bucket/a/./b", "s3://bucket/a\nb",
        "s3://bucket/a\\b", "http://bucket/x"}) {
    auto loc = parse_s3_uri(bad);
    ASSERT_FALSE(loc) << bad;
    EXPECT_EQ(loc.error().code, errc::invalid_argument);
    EXPECT_NE(loc.error().message.find("S3 URI"), std::string::npos) << loc.error().message;
  }
}

TEST(endpoint, parses_http_and_https_endpoints) {
  auto ep = parse_endpoint("http://127.0.0.1:9000");
  ASSERT_TRUE(ep) << to_string(ep.error());
  EXPECT_EQ(ep->host, "127.0.0.1");
  EXPECT_EQ(ep->port, 9000);
  EXPECT_FALSE(ep->tls());
  EXPECT_EQ(ep->host_header(), "127.0.0.1:9000");
  auto aws = parse_endpoint("https://s3.us-east-1.amazonaws.com/");
  ASSERT_TRUE(aws);
  EXPECT_EQ(aws->port, 443);
  EXPECT_EQ(aws->host_header(), "s3.us-east-1.amazonaws.com");
  auto v6 = parse_endpoint("http://[::1]:8080");
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->host_header(), "[::1]:8080");
  for (std::string_view bad :
       {"127.0.0.1:9000", "ftp://x", "http://", "http://h:0", "http://h:70000",
        "http://h:", "http://h/path", "http://u@h", "http://h?x", "http://h x", "http://[::1"})
    EXPECT_FALSE(parse_endpoint(bad)) << bad;
}

TEST(list_objects_v2, parses_a_truncated_page_with_prefixes_and_entities) {
  const std::string xml = R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>bucket</Name><Prefix>p/</Prefix><KeyCount>3</KeyCount><MaxKeys>2</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <Contents><Key>p/a&amp;b</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified>
    <ETag>&quot;abc&quot;</ETag><Size>12</Size><StorageClass>STANDARD</StorageClass></Contents>
  <Contents><Key><![CDATA[p/<c>]]></Key><Size>0</Size></Contents>
  <!-- a comment -->
  <CommonPrefixes><Prefix>p/run&#x31;/</Prefix></CommonPrefixes>
  <NextContinuationToken>tok+/=</NextContinuationToken>
</ListBucketResult>)";
  auto page = parse_list_objects_v2(xml);
  ASSERT_TRUE(page) << to_string(page.error());
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "p/a&b");
  EXPECT_EQ(page->objects[0].size, 12u);
  EXPECT_EQ(page->objects[0].etag, "\"abc\"");
  EXPECT_EQ(page->objects[1].key, "p/<c>");
  ASSERT_EQ(page->common_prefixes.size(), 1u);
  EXPECT_EQ(page->common_prefixes[0], "p/run1/");
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_continuation_token, "tok+/=");
}

TEST(list_objects_v2, parses_the_last_and_an_empty_page) {
  auto last = parse_list_objects_v2(
    "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k</Key><Size>1</Size>"
    "</Contents></ListBucketResult>");
  ASSERT_TRUE(last);
  EXPECT_FALSE(last->truncated);
  EXPECT_EQ(last->objects.size(), 1u);
  auto empty = parse_list_objects_v2("<ListBucketResult><Name>b</Name><KeyCount>0</KeyCount>"
                                     "<IsTruncated>false</IsTruncated></ListBucketResult>");
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->objects.empty());
}

TEST(list_objects_v2, refuses_hostile_and_malformed_input) {
  const std::vector<std::string> bad = {
    "",
    "not xml",
    "<ListBucketResult>",
    "<ListBucketResult></Other>",
    "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
    "<ListBucketResult><IsTruncated>maybe</IsTruncated></ListBucketResult>",
    "<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",
    "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>",
    "<ListBucketResult><Contents><Key>&bogus;</Key></Contents></ListBucketResult>",
    "<ListBucketResult><Contents><Key>&#0;</Key></Contents></ListBucketResult>",
    "<ListBucketResult><Contents><Key>&#xD800;</Key></Contents></ListBucketResult>",
    "<!DOCTYPE x [<!ENTITY a \"aaaa\">]><ListBucketResult>&a;</ListBucketResult>",
    "<ListBucketResult/><ListBucketResult/>",
    "<Other/>",
    "<ListBucketResult><Key attr=\"a>b\"</ListBucketResult>",
  };
  for (const auto& xml : bad) {
    auto page = parse_list_objects_v2(xml);
    EXPECT_FALSE(page) << xml;
    if (!page) {
      EXPECT_EQ(page.error().code, errc::backend_failure);
    }
  }
}

TEST(list_objects_v2, names_the_problem_and_reads_escapes_and_cdata) {
  auto doctype = parse_list_objects_v2(
    "<!DOCTYPE x [<!ENTITY a \"aaaa\">]><ListBucketResult>&a;</ListBucketResult>");
  ASSERT_FALSE(doctype);
  EXPECT_NE(doctype.error().message.find("DOCTYPE"), std::string::npos) << doctype.error().message;
  auto junk = parse_list_objects_v2("<ListBucketResult></Other>");
  ASSERT_FALSE(junk);
  EXPECT_NE(junk.error().message.find("line 1"), std::string::npos) << junk.error().message;
  auto page = parse_list_objects_v2(
    "<s3:ListBucketResult xmlns:s3=\"x\"><s3:IsTruncated>false</s3:IsTruncated>"
    "<s3:Contents><s3:Key>a&amp;b&#x263A;<![CDATA[<c>]]></s3:Key><s3:Size>7</s3:Size>"
    "</s3:Contents></s3:ListBucketResult>");
  ASSERT_TRUE(page) << page.error().message;
  ASSERT_EQ(page->objects.size(), 1u);
  EXPECT_EQ(page->objects[0].key, "a&b\xE2\x98\xBA<c>");
  EXPECT_EQ(page->objects[0].size, 7u);
}

TEST(list_objects_v2, refuses_deep_nesting_huge_documents_and_huge_text) {
  std::string deep;
  for (int i = 0; i < 100; ++i)
    deep += "<a>";
  EXPECT_FALSE(parse_list_objects_v2("<ListBucketResult>" + deep));

  std::string huge(max_s3_xml_bytes + 1, ' ');
  huge.replace(0, 18, "<ListBucketResult>");
  EXPECT_FALSE(parse_list_objects_v2(huge));

  std::string long_key = "<ListBucketResult><Contents><Key>" + std::string(100'000, 'k')
                         + "</Key></Contents></ListBucketResult>";
  EXPECT_FALSE(parse_list_objects_v2(long_key));

  std::string many = "<ListBucketResult>";
  for (size_t i = 0; i <= max_s3_list_entries; ++i)
    many += "<Contents><Key>k</Key></Contents>";
  many += "</ListBucketResult>";
  auto page = parse_list_objects_v2(many);
  ASSERT_FALSE(page);
  EXPECT_NE(page.error().message.find("entries"), std::string::npos);
}

TEST(list_objects_v2, reports_an_error_document) {
  auto page = parse_list_objects_v2(
    "<Error><Code>NoSuchBucket</Code><Message>The bucket does not exist</Message></Error>");
  ASSERT_FALSE(page);
  EXPECT_NE(page.error().message.find("NoSuchBucket"), std::string::npos);
}

TEST(s3_errors, map_to_the_project_codes) {
  auto missing = s3_error_to_error(
    404, "<Error><Code>NoSuchKey</Code><Message>The key does not exist</Message></Error>",
    "GetObject s3://b/k");
  EXPECT_EQ(missing.code, errc::not_found);
  EXPECT_NE(missing.message.find("s3://b/k"), std::string::npos);
  EXPECT_EQ(s3_error_to_error(404, "", "HeadObject").code, errc::not_found);
  EXPECT_EQ(s3_error_to_error(412, "", "PutObject").code, errc::conflict);
  EXPECT_EQ(
    s3_error_to_error(412, "<Error><Code>PreconditionFailed</Code></Error>", "PutObject").code,
    errc::conflict);
  auto denied = s3_error_to_error(
    403, "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>", "GetObject");
  EXPECT_EQ(denied.code, errc::backend_failure);
  EXPECT_NE(denied.message.find("403 AccessDenied: Access Denied"), std::string::npos)
    << denied.message;
  EXPECT_EQ(s3_error_to_error(404, "<Error><Code>NoSuchBucket</Code></Error>", "x").code,
            errc::backend_failure);
  EXPECT_EQ(parse_s3_error("garbage").code, "");
}

TEST(s3_config, reads_the_environment) {
  setenv("AWS_ACCESS_KEY_ID", "AKID", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "SECRET", 1);
  setenv("AWS_SESSION_TOKEN", "TOKEN", 1);
  unsetenv("AWS_REGION");
  setenv("AWS_DEFAULT_REGION", "eu-west-1", 1);
  setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:4568", 1);
  auto c = s3_config::from_environment();
  EXPECT_EQ(c.credentials.access_key_id, "AKID");
  EXPECT_EQ(c.credentials.secret_access_key, "SECRET");
  EXPECT_EQ(c.credentials.session_token, "TOKEN");
  EXPECT_EQ(c.region, "eu-west-1");
  EXPECT_EQ(c.endpoint, "http://127.0.0.1:4568");
  setenv("AWS_REGION", "us-west-2", 1);
  EXPECT_EQ(s3_config::from_environment().region, "us-west-2");
  for (const char* name : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                           "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL"})
    unsetenv(name);
  EXPECT_EQ(s3_config::from_environment().region, "us-east-1");
}

TEST(s3_client, open_requires_credentials_and_a_valid_endpoint) {
  s3_config c;
  auto none = s3_client::open(c);
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("AWS_ACCESS_KEY_ID"), std::string::npos);
  c.credentials = {"a", "b", ""};
  c.endpoint = "127.0.0.1:9000";
  EXPECT_FALSE(s3_client::open(c));
  c.endpoint = "";
  auto aws = s3_client::open(c);
  ASSERT_TRUE(aws);
  EXPECT_EQ((*aws)->config().endpoint, "https://s3.us-east-1.amazonaws.com");
}

TEST(s3_client, an_unreachable_endpoint_is_a_backend_failure_naming_it) {
  s3_config c;
  c.credentials = {"a", "b", ""};
  c.endpoint = "http://127.0.0.1:1";
  c.max_attempts = 1;
  auto client = s3_client::open(c);
  ASSERT_TRUE(client);
  auto got = (*client)->get_object("bucket", "key");
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, errc::backend_failure);
  EXPECT_NE(got.error().message.find("http://127.0.0.1:1"), std::string::npos)
    << got.error().message;
}
