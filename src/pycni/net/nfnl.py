"""nfnetlink's and nf_tables' netlink numbers (linux/netfilter/nfnetlink.h, nf_tables.h), in one
place for every module that speaks them: the probes (:mod:`pycni.net.probe`), the table reader
(:mod:`pycni.net.nftdump`), the batch writer (:mod:`pycni.net.nftbatch`) and rule encoder
(:mod:`pycni.net.nftrule`), NFLOG and conntrack. Numbers only, no imports: the probes are on
one-shot DEL paths."""

NETLINK_NETFILTER = 12
NFNL_SUBSYS_CTNETLINK, NFNL_SUBSYS_ULOG, NFNL_SUBSYS_NFTABLES = 1, 4, 10
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 0x10, 0x11
# nft's family names -> NFPROTO_*
FAMILIES = {"inet": 1, "ip": 2, "arp": 3, "netdev": 5, "bridge": 7, "ip6": 10}

# messages
NFT_MSG_NEWTABLE, NFT_MSG_GETTABLE, NFT_MSG_DELTABLE = 0, 1, 2
NFT_MSG_NEWCHAIN, NFT_MSG_GETCHAIN, NFT_MSG_DELCHAIN = 3, 4, 5
NFT_MSG_NEWRULE, NFT_MSG_GETRULE, NFT_MSG_DELRULE = 6, 7, 8
NFT_MSG_NEWSET, NFT_MSG_GETSET, NFT_MSG_DELSET = 9, 10, 11
NFT_MSG_NEWSETELEM, NFT_MSG_GETSETELEM, NFT_MSG_DELSETELEM = 12, 13, 14
NFT_MSG_GETGEN = 16

# attributes
NFTA_GEN_ID = 1
NFTA_TABLE_NAME = 1
NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME, NFTA_CHAIN_HOOK, NFTA_CHAIN_POLICY, NFTA_CHAIN_USERDATA = 1, 3, 4, 5, 12
NFTA_HOOK_HOOKNUM, NFTA_HOOK_PRIORITY = 1, 2
NFTA_RULE_TABLE, NFTA_RULE_CHAIN, NFTA_RULE_EXPRESSIONS, NFTA_RULE_USERDATA = 1, 2, 4, 7
NFTA_SET_TABLE, NFTA_SET_NAME, NFTA_SET_FLAGS, NFTA_SET_KEY_TYPE, NFTA_SET_KEY_LEN = 1, 2, 3, 4, 5
NFTA_SET_DESC, NFTA_SET_ID, NFTA_SET_USERDATA = 9, 10, 13
NFTA_SET_DESC_SIZE = 1
NFT_SET_ANONYMOUS, NFT_SET_CONSTANT, NFT_SET_INTERVAL, NFT_SET_MAP = 0x1, 0x2, 0x4, 0x8
NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_ELEMENTS, NFTA_SET_ELEM_LIST_SET_ID = 1, 2, 3, 4
NFTA_LIST_ELEM = 1
NFTA_SET_ELEM_KEY, NFTA_SET_ELEM_DATA, NFTA_SET_ELEM_FLAGS = 1, 2, 3
NFT_SET_ELEM_INTERVAL_END = 1
NFTA_DATA_VALUE, NFTA_DATA_VERDICT = 1, 2
NFTA_VERDICT_CODE, NFTA_VERDICT_CHAIN = 1, 2
NFTNL_UDATA_COMMENT = 0  # a rule's or chain's comment in its userdata (libnftnl's TLV)

# verdict codes (NF_DROP, NF_ACCEPT and nf_tables' own), both ways
VERDICTS = {0: "drop", 1: "accept", -1: "continue", -2: "break", -3: "jump", -4: "goto", -5: "return"}
VERDICT_CODES = {word: code for code, word in VERDICTS.items()}
